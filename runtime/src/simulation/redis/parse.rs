//! Redis's own rules for reading numbers and patterns out of arguments and for printing doubles, ported so that
//! the simulated server accepts, refuses and prints exactly what redis-server 7.0 does (`util.c`: `string2ll`,
//! `string2d`, `stringmatchlen`; `networking.c`: `addReplyDouble`'s `%.17g`).

/// `string2ll`: a decimal integer with no sign but `-`, no leading zeros, no spaces, fitting an i64. What
/// `getLongLongFromObject` (and `getLongFromObject`, a long being 64 bits here) accepts.
pub(super) fn int(s: &[u8]) -> Option<i64> {
    // Redis refuses 21 characters or more before looking at them (LONG_STR_SIZE).
    if s.is_empty() || s.len() >= 21 {
        return None;
    }
    if s == b"0" {
        return Some(0);
    }
    let (negative, digits) = match s.strip_prefix(b"-") {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    match digits.first() {
        Some(b'1'..=b'9') => {}
        _ => return None,
    }
    let mut v: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if negative {
        // -v fits down to i64::MIN, whose magnitude is one more than i64::MAX.
        0i64.checked_sub_unsigned(v)
    } else {
        i64::try_from(v).ok()
    }
}

/// `strtod` on a prefix of `s` as glibc reads it (no leading spaces skipped: every caller refuses or has
/// none): the value and how many bytes it used (0: no number). Decimal and hexadecimal forms, `inf`,
/// `infinity` and `nan` in any case. Also whether the value is out of range (ERANGE): too large, or a non-zero
/// number that reads as zero.
pub(super) fn strtod_prefix(s: &[u8]) -> (f64, usize, bool) {
    let mut i = 0;
    let negative = match s.first() {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let sign = if negative { -1.0 } else { 1.0 };
    let rest = &s[i..];
    let lower = |n: usize| rest.get(..n).map(<[u8]>::to_ascii_lowercase);
    if lower(8).as_deref() == Some(b"infinity") {
        return (sign * f64::INFINITY, i + 8, false);
    }
    if lower(3).as_deref() == Some(b"inf") {
        return (sign * f64::INFINITY, i + 3, false);
    }
    if lower(3).as_deref() == Some(b"nan") {
        return (f64::NAN, i + 3, false);
    }
    if lower(2).as_deref() == Some(b"0x") {
        if let Some((value, used)) = hex_float(&rest[2..]) {
            return (sign * value, i + 2 + used, value.is_infinite());
        }
        // "0x" with no hex digit after it: strtod reads the "0" alone.
        return (0.0, i + 1, false);
    }
    let start = i;
    let (mut digits, mut nonzero) = (0, false);
    while let Some(d) = s.get(i).filter(|d| d.is_ascii_digit()) {
        nonzero |= *d != b'0';
        digits += 1;
        i += 1;
    }
    if s.get(i) == Some(&b'.') {
        i += 1;
        while let Some(d) = s.get(i).filter(|d| d.is_ascii_digit()) {
            nonzero |= *d != b'0';
            digits += 1;
            i += 1;
        }
    }
    if digits == 0 {
        return (0.0, 0, false);
    }
    // An exponent counts only with at least one digit after its sign.
    if matches!(s.get(i), Some(b'e' | b'E')) {
        let mut j = i + 1;
        if matches!(s.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        if s.get(j).is_some_and(u8::is_ascii_digit) {
            while s.get(j).is_some_and(u8::is_ascii_digit) {
                j += 1;
            }
            i = j;
        }
    }
    // The text is a valid decimal number by now; Rust reads it correctly rounded, as glibc does.
    let text = std::str::from_utf8(&s[start..i]).unwrap_or("0");
    let value: f64 = text.parse().unwrap_or(0.0);
    let out_of_range = value.is_infinite() || (value == 0.0 && nonzero);
    (sign * value, i, out_of_range)
}

/// The digits of a hexadecimal float after its `0x`, with an optional binary exponent (`p`): its value and the
/// bytes used, `None` without a digit. Digits past the 15th are read too, rounded by the float arithmetic.
fn hex_float(s: &[u8]) -> Option<(f64, usize)> {
    let (mut i, mut value, mut digits, mut scale) = (0, 0.0f64, 0, 0i32);
    while let Some(d) = s.get(i).and_then(|c| (*c as char).to_digit(16)) {
        value = value * 16.0 + f64::from(d);
        digits += 1;
        i += 1;
    }
    if s.get(i) == Some(&b'.') {
        i += 1;
        while let Some(d) = s.get(i).and_then(|c| (*c as char).to_digit(16)) {
            value = value * 16.0 + f64::from(d);
            scale -= 4;
            digits += 1;
            i += 1;
        }
    }
    if digits == 0 {
        return None;
    }
    if matches!(s.get(i), Some(b'p' | b'P')) {
        let mut j = i + 1;
        let negative = s.get(j) == Some(&b'-');
        if matches!(s.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        let mut exponent: i32 = 0;
        let mut any = false;
        while let Some(d) = s.get(j).filter(|d| d.is_ascii_digit()) {
            exponent = exponent.saturating_mul(10).saturating_add(i32::from(d - b'0'));
            any = true;
            j += 1;
        }
        if any {
            scale = scale.saturating_add(if negative { -exponent } else { exponent });
            i = j;
        }
    }
    Some((value * 2f64.powi(scale), i))
}

/// `string2d`: the whole argument as a double, as ZADD's scores are read; no spaces, no NaN, nothing out of
/// range.
pub(super) fn double(s: &[u8]) -> Option<f64> {
    if s.is_empty() || s[0].is_ascii_whitespace() || s[0] == b'\x0b' {
        return None;
    }
    let (value, used, out_of_range) = strtod_prefix(s);
    (used == s.len() && !out_of_range && !value.is_nan()).then_some(value)
}

/// `strtoul` as SCAN reads its cursor (`parseScanCursorOrReply`): `None` for an invalid cursor. A leading
/// space is refused; an empty argument reads as 0 and a negative one wraps, as in C.
pub(super) fn cursor(s: &[u8]) -> Option<u64> {
    if s.first().is_some_and(|c| c.is_ascii_whitespace() || *c == b'\x0b') {
        return None;
    }
    let (negative, digits) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        // No digits: strtoul consumed nothing, which is valid only for an empty argument.
        return s.is_empty().then_some(0);
    }
    let mut v: u64 = 0;
    for d in digits {
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some(if negative { v.wrapping_neg() } else { v })
}

/// Whether `a` equals the ASCII text `b` ignoring case (`strcasecmp`).
pub(super) fn is(a: &[u8], b: &str) -> bool {
    a.eq_ignore_ascii_case(b.as_bytes())
}

/// A double as redis-server 7.0 prints it in replies and as scripts' number arguments: `%.17g` (inf as
/// `inf`).
pub(super) fn format_double(x: f64) -> String {
    format_g(x, 17)
}

/// `%.<precision>g` as glibc prints it (Lua's own `tostring` of a number is `%.14g`).
pub(super) fn format_g(x: f64, precision: u8) -> String {
    if x.is_nan() {
        return if x.is_sign_negative() { "-nan" } else { "nan" }.to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.to_owned();
    }
    // An integer of at most P digits prints as itself (the general path's two format! calls were a tenth of a
    // simulated script call: most numbers scripts pass are ttls and counts); below 2^53 every one is exact.
    if x.fract() == 0.0 && x.abs() < 9.0e15_f64.min(10f64.powi(i32::from(precision.max(1)))) {
        return (x as i64).to_string();
    }
    format_g_digits(x, precision)
}

/// [`format_g`] of a finite, non-zero `x` by its digits (the path every number but a short integer takes).
pub(super) fn format_g_digits(x: f64, precision: u8) -> String {
    // %.Pg: P significant digits, fixed notation for exponents from -4 to P - 1, trailing zeros removed.
    let (precision, digits) = (i32::from(precision.max(1)), usize::from(precision.max(1)) - 1);
    let scientific = format!("{x:.digits$e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..precision).contains(&exponent) {
        let decimals = usize::try_from(precision - 1 - exponent).unwrap_or(0);
        trim_zeros(format!("{x:.decimals$}"))
    } else {
        let mantissa = trim_zeros(mantissa.to_owned());
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
    }
}

/// `%g` drops trailing zeros of the fraction, and the point when nothing follows it.
fn trim_zeros(mut s: String) -> String {
    if s.contains('.') {
        while s.ends_with('0') {
            s.pop();
        }
        if s.ends_with('.') {
            s.pop();
        }
    }
    s
}

/// `stringmatchlen` (case sensitive): whether `text` matches the glob `pattern`, as SCAN's MATCH decides it.
/// Characters compare as C's signed chars, in ranges too; past the end of either string reads as the NUL
/// that ends every sds.
pub(super) fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let mut skip_longer = false;
    glob_at(pattern, text, &mut skip_longer)
}

/// `stringmatchlen_impl`: `skip_longer` is set once the rest of the pattern matched nowhere after a `*`, so an
/// earlier `*` need not try longer matches (Redis's guard against exponential backtracking).
fn glob_at(pattern: &[u8], text: &[u8], skip_longer: &mut bool) -> bool {
    let at = |s: &[u8], i: usize| s.get(i).copied().unwrap_or(0);
    let (mut p, mut s) = (0usize, 0usize);
    // Lengths left, as the C code counts them (it may step the pattern back by one at an unclosed class).
    while p < pattern.len() && s < text.len() {
        match pattern[p] {
            b'*' => {
                while p < pattern.len() && at(pattern, p + 1) == b'*' {
                    p += 1;
                }
                if pattern.len() - p == 1 {
                    return true;
                }
                while s < text.len() {
                    if glob_at(&pattern[p + 1..], &text[s..], skip_longer) {
                        return true;
                    }
                    if *skip_longer {
                        return false;
                    }
                    s += 1;
                }
                *skip_longer = true;
                return false;
            }
            b'?' => s += 1,
            b'[' => {
                p += 1;
                let not = at(pattern, p) == b'^';
                if not {
                    p += 1;
                }
                let c = text[s] as i8;
                let mut matched = false;
                loop {
                    let left = pattern.len().saturating_sub(p);
                    if at(pattern, p) == b'\\' && left >= 2 {
                        p += 1;
                        matched |= at(pattern, p) == text[s];
                    } else if at(pattern, p) == b']' {
                        break;
                    } else if left == 0 {
                        p -= 1;
                        break;
                    } else if left >= 3 && at(pattern, p + 1) == b'-' {
                        let (a, b) = (at(pattern, p) as i8, at(pattern, p + 2) as i8);
                        let (lo, hi) = (a.min(b), a.max(b));
                        p += 2;
                        matched |= c >= lo && c <= hi;
                    } else {
                        matched |= at(pattern, p) == text[s];
                    }
                    p += 1;
                }
                if matched == not {
                    return false;
                }
                s += 1;
            }
            first => {
                let literal = if first == b'\\' && pattern.len() - p >= 2 {
                    p += 1;
                    pattern[p]
                } else {
                    first
                };
                if literal != text[s] {
                    return false;
                }
                s += 1;
            }
        }
        p += 1;
        if s == text.len() {
            while at(pattern, p) == b'*' && p < pattern.len() {
                p += 1;
            }
            break;
        }
    }
    p >= pattern.len() && s == text.len()
}

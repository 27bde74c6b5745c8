//! Parser for the attribute's templates: lock keys such as `"report:<id>"` or
//! `"tenant:<self.tenant>:user:<req.user.id>"`, and metadata such as `"replica <replica>"`.
//!
//! Grammar: text is copied verbatim; `<path>` is a placeholder, where `path` is a parameter name optionally
//! followed by `.field` segments (`<self.tenant>`, `<req.user.id>`, `<pair.0>`); `<<` and `>>` write a literal
//! `<` and `>`. Both kinds share it; a key's text must also be a valid key ([`TemplateKind::Key`]). Errors carry
//! the byte range of the offending part of the template so the caller can point at it.

use std::ops::Range;

/// The longest key the runtime accepts, in bytes (its `InvalidKey` check); the template's text alone must fit.
const MAX_KEY_BYTES: usize = 1024;

/// Which argument a template is: a key's text has the runtime's key rules to follow; metadata is any text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TemplateKind {
    /// `key`: not empty, no control characters, at most [`MAX_KEY_BYTES`] of text.
    Key,
    /// `metadata`: any text.
    Metadata,
}

impl TemplateKind {
    /// The template as messages name it.
    fn noun(self) -> &'static str {
        match self {
            TemplateKind::Key => "the lock key",
            TemplateKind::Metadata => "`metadata`",
        }
    }
}

/// A parsed template: literal text and placeholders, in order. Adjacent text is merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    /// The parts of the key, in order.
    pub(crate) segments: Vec<Segment>,
}

/// One part of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Literal text (with `<<`/`>>` already unescaped), copied verbatim.
    Text(String),
    /// A `<path>` placeholder whose value is formatted with `Display` (and, in a key, escaped).
    Placeholder(Placeholder),
}

/// A `<name.field.field>` placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placeholder {
    /// The dot-separated path as written: a parameter name (or `self`) then field names or tuple indices.
    pub(crate) path: Vec<String>,
    /// Byte range of the whole placeholder, angle brackets included, in the template.
    pub(crate) range: Range<usize>,
}

impl Placeholder {
    /// The placeholder as written in the template, e.g. `<req.user.id>`.
    pub(crate) fn display(&self) -> String {
        format!("<{}>", self.path.join("."))
    }
}

/// A template error: the message shown to the user and the byte range it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TemplateError {
    /// Complete, user-facing message.
    pub(crate) message: String,
    /// Byte range in the template that the message is about.
    pub(crate) range: Range<usize>,
}

impl TemplateError {
    fn new(message: impl Into<String>, range: Range<usize>) -> Self {
        TemplateError { message: message.into(), range }
    }
}

/// Parses a key template, reporting every error found (not just the first).
#[cfg(test)]
pub(crate) fn parse_template(text: &str) -> Result<Template, Vec<TemplateError>> {
    parse_template_of(TemplateKind::Key, text)
}

/// Parses a template of `kind`, reporting every error found.
#[cfg(test)]
pub(crate) fn parse_template_of(kind: TemplateKind, text: &str) -> Result<Template, Vec<TemplateError>> {
    let (template, errors) = parse_template_lenient(kind, text);
    if errors.is_empty() {
        Ok(template)
    } else {
        Err(errors)
    }
}

/// Parses a template of `kind`, returning the parts that are valid together with every error, so that the
/// valid placeholders can still be checked against the function's parameters.
pub(crate) fn parse_template_lenient(kind: TemplateKind, text: &str) -> (Template, Vec<TemplateError>) {
    let what = kind.noun();
    if text.is_empty() && kind == TemplateKind::Key {
        let error = TemplateError::new("the lock key cannot be empty; write a template such as \"report:<id>\"", 0..0);
        return (Template { segments: Vec::new() }, vec![error]);
    }
    let mut segments = Vec::new();
    let mut errors = Vec::new();
    let mut literal = String::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < text.len() {
        match bytes[i] {
            b'<' if bytes.get(i + 1) == Some(&b'<') => {
                literal.push('<');
                i += 2;
            }
            b'>' if bytes.get(i + 1) == Some(&b'>') => {
                literal.push('>');
                i += 2;
            }
            b'>' => {
                errors.push(TemplateError::new(format!("stray `>` in {what}; write `>>` for a literal `>`"), i..i + 1));
                i += 1;
            }
            b'<' => {
                let start = i;
                let body_start = i + 1;
                // The placeholder ends at the next `>`; a `<` before it means this one was never closed.
                let end = text[body_start..].find(['<', '>']).map(|offset| body_start + offset);
                match end {
                    Some(end) if bytes[end] == b'>' => {
                        let range = start..end + 1;
                        match parse_path(kind, &text[body_start..end], range.clone()) {
                            Ok(placeholder) => {
                                if !literal.is_empty() {
                                    segments.push(Segment::Text(std::mem::take(&mut literal)));
                                }
                                segments.push(Segment::Placeholder(placeholder));
                            }
                            Err(error) => errors.push(error),
                        }
                        i = end + 1;
                    }
                    Some(next_open) => {
                        errors.push(unclosed(kind, text, start, next_open));
                        i = next_open;
                    }
                    None => {
                        errors.push(unclosed(kind, text, start, text.len()));
                        i = text.len();
                    }
                }
            }
            _ => {
                // Copy one whole UTF-8 character.
                let ch = text[i..].chars().next().unwrap_or_default();
                let width = ch.len_utf8().max(1);
                if ch.is_control() && kind == TemplateKind::Key {
                    errors.push(TemplateError::new(
                        format!(
                            "the lock key contains the control character `{}`, which keys cannot contain",
                            ch.escape_debug()
                        ),
                        i..i + width,
                    ));
                }
                literal.push(ch);
                i += width;
            }
        }
    }
    if !literal.is_empty() {
        segments.push(Segment::Text(literal));
    }
    let text_bytes: usize = segments.iter().map(|s| if let Segment::Text(t) = s { t.len() } else { 0 }).sum();
    if text_bytes > MAX_KEY_BYTES && kind == TemplateKind::Key {
        errors.push(TemplateError::new(
            format!("the lock key's text is {text_bytes} bytes long; keys can have at most {MAX_KEY_BYTES} bytes"),
            0..text.len(),
        ));
    }
    (Template { segments }, errors)
}

fn unclosed(kind: TemplateKind, text: &str, start: usize, end: usize) -> TemplateError {
    TemplateError::new(
        format!(
            "unclosed `<` in {}: `{}` has no closing `>`; write `<<` for a literal `<`",
            kind.noun(),
            &text[start..end]
        ),
        start..end,
    )
}

/// Parses the inside of `<...>` into a path; `range` covers the whole placeholder.
fn parse_path(kind: TemplateKind, inner: &str, range: Range<usize>) -> Result<Placeholder, TemplateError> {
    let written = format!("<{inner}>");
    if inner.is_empty() {
        return Err(TemplateError::new(
            format!(
                "empty placeholder `<>` in {}; name a parameter, e.g. `<id>`, or write `<<>>` for a literal `<>`",
                kind.noun()
            ),
            range,
        ));
    }
    let expected = "expected a parameter name or a field path such as `<id>`, `<self.tenant>` or `<req.user.id>`";
    if inner.chars().any(|c| !(c == '.' || c == '_' || c == '#' || c.is_alphanumeric())) {
        return Err(TemplateError::new(
            format!(
                "invalid placeholder `{written}`: {expected}; expressions, calls and spaces are not allowed \
                 (compute the value in a parameter, or write `<<` and `>>` for literal angle brackets)"
            ),
            range,
        ));
    }
    let path: Vec<String> = inner.split('.').map(str::to_owned).collect();
    for (index, segment) in path.iter().enumerate() {
        let problem = if segment.is_empty() {
            Some("a field name is missing around a `.`".to_owned())
        } else if index == 0 && !is_identifier(segment) {
            Some(format!("`{segment}` is not a parameter name"))
        } else if index > 0 && !is_identifier(segment) && !is_tuple_index(segment) {
            Some(format!("`{segment}` is not a field name or tuple index"))
        } else if index > 0 && segment == "self" {
            Some("`self` can only start a placeholder".to_owned())
        } else if matches!(segment.strip_prefix("r#").unwrap_or(segment), "Self" | "super" | "crate" | "_")
            || segment == "r#self"
        {
            Some(format!("`{segment}` cannot be used in a placeholder"))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(TemplateError::new(format!("invalid placeholder `{written}`: {problem}; {expected}"), range));
        }
    }
    Ok(Placeholder { path, range })
}

/// Whether `text` is a Rust identifier (optionally raw, `r#type`), keywords included.
pub(crate) fn is_identifier(text: &str) -> bool {
    let text = text.strip_prefix("r#").unwrap_or(text);
    let mut chars = text.chars();
    match chars.next() {
        Some(first) if first == '_' || first.is_alphabetic() => chars.all(|c| c == '_' || c.is_alphanumeric()),
        _ => false,
    }
}

/// Whether `text` is a tuple index such as `0` or `12` (no leading zeros).
fn is_tuple_index(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) && (text == "0" || !text.starts_with('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Segment {
        Segment::Text(s.to_owned())
    }

    fn ph(path: &[&str], range: Range<usize>) -> Segment {
        Segment::Placeholder(Placeholder { path: path.iter().map(|s| s.to_string()).collect(), range })
    }

    fn errors(template: &str) -> Vec<TemplateError> {
        parse_template(template).expect_err("expected an error")
    }

    #[test]
    fn plain_text() {
        assert_eq!(parse_template("jobs:nightly").unwrap().segments, vec![text("jobs:nightly")]);
    }

    #[test]
    fn placeholders() {
        let t = parse_template("report:<id>").unwrap();
        assert_eq!(t.segments, vec![text("report:"), ph(&["id"], 7..11)]);
        let t = parse_template("<a><b>").unwrap();
        assert_eq!(t.segments, vec![ph(&["a"], 0..3), ph(&["b"], 3..6)]);
    }

    #[test]
    fn field_paths() {
        let t = parse_template("t:<self.tenant>:u:<req.user.id>:<pair.0>").unwrap();
        assert_eq!(
            t.segments,
            vec![
                text("t:"),
                ph(&["self", "tenant"], 2..15),
                text(":u:"),
                ph(&["req", "user", "id"], 18..31),
                text(":"),
                ph(&["pair", "0"], 32..40),
            ]
        );
    }

    #[test]
    fn raw_and_unicode_identifiers() {
        let t = parse_template("<r#type>:<größe>").unwrap();
        assert_eq!(t.segments[0], ph(&["r#type"], 0..8));
        assert!(matches!(&t.segments[2], Segment::Placeholder(p) if p.path == ["größe"]));
    }

    #[test]
    fn escapes() {
        let t = parse_template("a<<b>>c").unwrap();
        assert_eq!(t.segments, vec![text("a<b>c")]);
        let t = parse_template("<<<id>>>").unwrap();
        assert_eq!(t.segments, vec![text("<"), ph(&["id"], 2..6), text(">")]);
        assert_eq!(parse_template("<<>>").unwrap().segments, vec![text("<>")]);
    }

    #[test]
    fn empty_key() {
        let e = errors("");
        assert_eq!(e.len(), 1);
        assert!(e[0].message.contains("cannot be empty"));
    }

    #[test]
    fn empty_placeholder() {
        let e = errors("report:<>");
        assert_eq!(e, vec![TemplateError::new(e[0].message.clone(), 7..9)]);
        assert!(e[0].message.starts_with("empty placeholder `<>`"));
    }

    #[test]
    fn unclosed() {
        let e = errors("report:<id");
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].range, 7..10);
        assert!(e[0].message.contains("`<id` has no closing `>`"), "{}", e[0].message);
        let e = errors("<a<b>");
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].range, 0..2);
    }

    #[test]
    fn stray_gt() {
        let e = errors("report>42");
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].range, 6..7);
        assert!(e[0].message.starts_with("stray `>`"));
        let e = errors("<id>>");
        assert_eq!(e[0].range, 4..5);
    }

    #[test]
    fn all_errors_reported() {
        let e = errors("a>b:<>:<c");
        assert_eq!(e.iter().map(|e| e.range.clone()).collect::<Vec<_>>(), vec![1..2, 4..6, 7..9]);
    }

    #[test]
    fn invalid_placeholders() {
        for bad in [
            "<id + 1>",
            "<a b>",
            "<1a>",
            "<a.>",
            "<.a>",
            "<a..b>",
            "<a.self>",
            "<Self>",
            "<a.01>",
            "<_>",
            "<f()>",
            "<r#self>",
            "<r#crate>",
        ] {
            let e = errors(bad);
            assert_eq!(e.len(), 1, "{bad}");
            assert_eq!(e[0].range, 0..bad.len(), "{bad}");
            assert!(e[0].message.starts_with("invalid placeholder"), "{bad}: {}", e[0].message);
        }
    }

    #[test]
    fn control_characters() {
        let e = errors("a\nb:<id>\t");
        assert_eq!(e.iter().map(|e| e.range.clone()).collect::<Vec<_>>(), vec![1..2, 8..9]);
        assert!(e[0].message.contains("`\\n`"), "{}", e[0].message);
    }

    #[test]
    fn too_long() {
        assert!(parse_template(&"k".repeat(1024)).is_ok());
        let e = errors(&format!("{}<id>", "k".repeat(1025)));
        assert_eq!(e.len(), 1);
        assert!(e[0].message.contains("1025 bytes"), "{}", e[0].message);
    }

    #[test]
    fn placeholder_display() {
        let t = parse_template("<req.user.id>").unwrap();
        let Segment::Placeholder(p) = &t.segments[0] else { panic!("not a placeholder") };
        assert_eq!(p.display(), "<req.user.id>");
    }

    #[test]
    fn multibyte_text() {
        let t = parse_template("café:<id>").unwrap();
        assert_eq!(t.segments, vec![text("café:"), ph(&["id"], 6..10)]);
    }

    /// Metadata is parsed by the same grammar, placeholders and escapes alike, without a key's text rules,
    /// and its errors name `metadata`.
    #[test]
    fn metadata_templates() {
        let metadata = |text: &str| parse_template_of(TemplateKind::Metadata, text);
        let t = metadata("replica <replica> <<#<self.n>>>").unwrap();
        let expected =
            vec![text("replica "), ph(&["replica"], 8..17), text(" <#"), ph(&["self", "n"], 21..29), text(">")];
        assert_eq!(t.segments, expected);
        assert_eq!(metadata("").unwrap().segments, vec![]);
        assert!(metadata(&format!("line\n{}", "m".repeat(2000))).is_ok(), "no key rules");
        let e = metadata("a>b <c <> <1x>").unwrap_err();
        assert_eq!(e.iter().map(|e| e.range.clone()).collect::<Vec<_>>(), vec![1..2, 4..7, 7..9, 10..14]);
        assert!(e[0].message.starts_with("stray `>` in `metadata`"), "{}", e[0].message);
        assert!(e[1].message.starts_with("unclosed `<` in `metadata`"), "{}", e[1].message);
        assert!(e[2].message.starts_with("empty placeholder `<>` in `metadata`"), "{}", e[2].message);
        assert!(e[3].message.starts_with("invalid placeholder `<1x>`"), "{}", e[3].message);
    }
}

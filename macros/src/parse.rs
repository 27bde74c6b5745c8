//! Parsing of the attribute's arguments: `key` or `keys`, `ttl`, `wait`, `retry`, `min_hold`, `max_hold`,
//! `on_lost`, `metadata`, `crate`.
//!
//! Syntax errors (a missing `=` or comma) stop parsing; every other problem (unknown, duplicate or missing
//! argument, bad value) is collected so that all of them are reported together.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, ExprArray, ExprLit, Ident, Lit, LitStr, Path, Token};

use crate::duration::parse_duration;
use crate::retry::{parse_retry, Retry};
use crate::template::{parse_template_lenient, Template, TemplateKind};
use crate::validate::closest;
use crate::Errors;

/// Default `ttl` when the argument is absent, in milliseconds.
pub(crate) const DEFAULT_TTL_MS: u64 = 30_000;
/// Default `wait` when the argument is absent, in milliseconds (0: a single attempt).
pub(crate) const DEFAULT_WAIT_MS: u64 = 0;

/// Smallest `ttl` the runtime accepts, in milliseconds (its `LockRequest::ttl` check).
const MIN_TTL_MS: u64 = 100;
/// Largest `ttl` the runtime accepts, in milliseconds (`i64::MAX / 4`, a bound Redis can store).
const MAX_TTL_MS: u64 = i64::MAX as u64 / 4;

/// Every argument the attribute accepts, in the order the docs list them.
const KNOWN: &[&str] = &["key", "keys", "ttl", "wait", "retry", "min_hold", "max_hold", "on_lost", "metadata", "crate"];

/// What to do when the lock is lost while the body runs (`on_lost = "abort" | "continue"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLost {
    /// Drop the body future and return the `Lost` error (the default).
    Abort,
    /// Let the body finish; the lock is no longer held.
    Continue,
}

/// A template argument (`key`, `metadata`) together with the literal it was written in (for spans).
#[derive(Debug)]
pub(crate) struct TemplateArg {
    /// The literal as written, used to point errors into the template.
    pub(crate) lit: LitStr,
    /// The parsed template: when the literal has errors, only its valid parts.
    pub(crate) template: Template,
}

impl TemplateArg {
    /// Parses `lit` as a template of `kind`, recording every error in it, each pointing into the literal.
    fn parse(kind: TemplateKind, lit: LitStr, errors: &mut Errors) -> Self {
        let (template, template_errors) = parse_template_lenient(kind, &lit.value());
        for e in template_errors {
            errors.push(syn::Error::new(crate::validate::span_in(&lit, e.range), e.message));
        }
        TemplateArg { lit, template }
    }
}

/// The validated arguments of one `#[distributed_lock(...)]`.
#[derive(Debug)]
pub(crate) struct Args {
    /// The lock key template (possibly partial, if errors were recorded); `None` when `keys` is given or an
    /// error about it has been recorded.
    pub(crate) key: Option<TemplateArg>,
    /// The key templates of `keys = [..]` (several locks taken together), distinct and at least one when no
    /// error was recorded; `None` when `key` is given.
    pub(crate) keys: Option<Vec<TemplateArg>>,
    /// Lease length in milliseconds (renewed by the watchdog while the body runs).
    pub(crate) ttl_ms: u64,
    /// How long to wait for a busy lock, in milliseconds.
    pub(crate) wait_ms: u64,
    /// How retries are spaced while waiting; `None` for the runtime's default.
    pub(crate) retry: Option<Retry>,
    /// Minimum time the lock stays held after it was acquired, in milliseconds.
    pub(crate) min_hold_ms: Option<u64>,
    /// Time after which renewals stop, in milliseconds.
    pub(crate) max_hold_ms: Option<u64>,
    /// Behaviour when the lock is lost.
    pub(crate) on_lost: OnLost,
    /// The metadata template, or `None` for `module_path::fn_name`.
    pub(crate) metadata: Option<TemplateArg>,
    /// Path to the `distlock` crate (default `::distlock`).
    pub(crate) krate: Option<Path>,
}

impl Args {
    /// The templates whose placeholders name the function's parameters: the key or keys, and the metadata if
    /// given.
    pub(crate) fn templates(&self) -> impl Iterator<Item = &TemplateArg> {
        self.key.iter().chain(self.keys.iter().flatten()).chain(&self.metadata)
    }
}

/// One `name = value` pair, before its name or value is checked.
struct RawArg {
    name: Ident,
    value: Expr,
}

impl Parse for RawArg {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        // `parse_any` so that the keyword `crate` is accepted as a name.
        let name = Ident::parse_any(input).map_err(|e| {
            syn::Error::new(
                e.span(),
                format!("expected an argument such as `key = \"report:<id>\"`; known arguments: {}", KNOWN.join(", ")),
            )
        })?;
        if !input.peek(Token![=]) {
            return Err(syn::Error::new(
                name.span(),
                format!("expected `=` after `{name}`: arguments are written `{name} = \"...\"`"),
            ));
        }
        input.parse::<Token![=]>()?;
        let value = input.parse()?;
        Ok(RawArg { name, value })
    }
}

/// Syntax of the whole argument list: `name = value` pairs separated by commas.
struct RawArgs(Punctuated<RawArg, Token![,]>);

impl Parse for RawArgs {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        Punctuated::parse_terminated(input).map(RawArgs)
    }
}

/// Parses and validates the attribute arguments, recording every problem in `errors`.
///
/// Absent arguments get their defaults; an invalid one is recorded and left at its default, so the result is only
/// meaningful when no error was recorded (the key, when valid, is still usable to check placeholders).
pub(crate) fn parse_args(tokens: proc_macro2::TokenStream, errors: &mut Errors) -> Args {
    let mut syntax_ok = true;
    let raw = match syn::parse2::<RawArgs>(tokens) {
        Ok(RawArgs(raw)) => raw,
        Err(e) => {
            errors.push(e);
            syntax_ok = false;
            Punctuated::new()
        }
    };
    let mut seen: Vec<Ident> = Vec::new();

    let mut key = None;
    let mut keys = None;
    let mut ttl_ms = None;
    let mut wait_ms = None;
    let mut retry = None;
    let mut min_hold_ms = None;
    let mut max_hold_ms = None;
    let mut wait_lit = None;
    let mut on_lost = None;
    let mut metadata = None;
    let mut krate = None;

    for RawArg { name, value } in raw {
        let name_str = name.unraw().to_string();
        if !KNOWN.contains(&name_str.as_str()) {
            let hint =
                closest(&name_str, KNOWN.iter().copied()).map(|c| format!("did you mean `{c}`? ")).unwrap_or_default();
            errors.push(syn::Error::new(
                name.span(),
                format!("unknown argument `{name_str}`; {hint}known arguments: {}", KNOWN.join(", ")),
            ));
            continue;
        }
        if seen.iter().any(|s| s == &name_str) {
            errors.push(syn::Error::new(
                name.span(),
                format!("duplicate argument `{name_str}`: each argument can be given once"),
            ));
            continue;
        }
        // One lock or several: `key` and `keys` exclude each other; the one written second is the error.
        let other = match name_str.as_str() {
            "key" => Some("keys"),
            "keys" => Some("key"),
            _ => None,
        };
        if let Some(other) = other.filter(|other| seen.iter().any(|s| s == other)) {
            errors.push(syn::Error::new(
                name.span(),
                format!(
                    "`key` and `keys` cannot both be given: use `key = \"..\"` for one lock, or put every template \
                     in `keys = [..]` to take several together; remove this `{name_str}` or the `{other}` before it"
                ),
            ));
            seen.push(name.clone());
            continue;
        }
        seen.push(name.clone());
        if name_str == "keys" {
            keys = Some(key_templates(&value, errors));
            continue;
        }
        let Some(lit) = string_literal(&name_str, &value, errors) else {
            continue;
        };
        match name_str.as_str() {
            "key" => key = Some(TemplateArg::parse(TemplateKind::Key, lit, errors)),
            "ttl" => {
                ttl_ms = duration(&name_str, &lit, errors);
                let problem = match ttl_ms {
                    Some(0) => Some("it must be greater than zero".to_owned()),
                    Some(ms) if ms < MIN_TTL_MS => Some(format!("it must be at least {MIN_TTL_MS}ms")),
                    Some(ms) if ms > MAX_TTL_MS => Some(format!("it must be at most {MAX_TTL_MS}ms, what Redis can store")),
                    _ => None,
                };
                if let Some(problem) = problem {
                    errors.push(syn::Error::new(
                        lit.span(),
                        format!("invalid `ttl`: {problem} (it is how long the lock lives if this process stops renewing it)"),
                    ));
                }
            }
            "wait" => {
                wait_ms = duration(&name_str, &lit, errors);
                wait_lit = Some(lit);
            }
            "retry" => match parse_retry(&lit.value()) {
                Ok(parsed) => retry = Some(parsed),
                Err(e) => errors.push(syn::Error::new(
                    crate::validate::span_in(&lit, e.range),
                    format!("invalid `retry`: {}", e.message),
                )),
            },
            "min_hold" => {
                min_hold_ms = duration(&name_str, &lit, errors);
                if min_hold_ms.is_some_and(|ms| ms > MAX_TTL_MS) {
                    errors.push(syn::Error::new(
                        lit.span(),
                        format!("invalid `min_hold`: it must be at most {MAX_TTL_MS}ms, what Redis can store"),
                    ));
                }
            }
            "max_hold" => {
                max_hold_ms = duration(&name_str, &lit, errors);
                if max_hold_ms == Some(0) {
                    errors.push(syn::Error::new(
                        lit.span(),
                        "invalid `max_hold`: it must be greater than zero (it is how long after acquiring the \
                         lock renewals stop, so that a hung body cannot hold it forever)",
                    ));
                }
            }
            "on_lost" => match lit.value().as_str() {
                "abort" => on_lost = Some(OnLost::Abort),
                "continue" => on_lost = Some(OnLost::Continue),
                other => errors.push(syn::Error::new(
                    lit.span(),
                    format!("unknown `on_lost` value {other:?}; expected \"abort\" (the default: drop the body and return the Lost error) or \"continue\""),
                )),
            },
            "metadata" => metadata = Some(TemplateArg::parse(TemplateKind::Metadata, lit, errors)),
            _ => match lit.parse::<Path>() {
                Ok(path) => krate = Some(path),
                Err(_) => errors.push(syn::Error::new(
                    lit.span(),
                    format!("`crate` expects a path to the distlock crate, such as \"distlock\" or \"::my_app::distlock\"; found {:?}", lit.value()),
                )),
            },
        }
    }

    if let (Some(Retry::None), Some(wait)) = (retry, &wait_lit) {
        if wait_ms.is_some_and(|ms| ms > 0) {
            errors.push(syn::Error::new(
                wait.span(),
                "`wait` has no effect with `retry = \"none\"`, which makes a single attempt; remove `wait`, or \
                 choose a retry strategy such as `retry = \"linear 100ms\"` to wait",
            ));
        }
    }
    // After a syntax error the arguments were not read, so `key` may well be there.
    if syntax_ok && !seen.iter().any(|s| s == "key" || s == "keys") {
        errors.push(syn::Error::new(
            Span::call_site(),
            "missing required argument `key`, e.g. `#[distributed_lock(key = \"report:<id>\")]` (or `keys = [..]` \
             for several locks taken together)",
        ));
    }
    Args {
        key,
        keys,
        ttl_ms: ttl_ms.unwrap_or(DEFAULT_TTL_MS),
        wait_ms: wait_ms.unwrap_or(DEFAULT_WAIT_MS),
        retry,
        min_hold_ms,
        max_hold_ms,
        on_lost: on_lost.unwrap_or(OnLost::Abort),
        metadata,
        krate,
    }
}

/// The templates of `keys = ["..", ..]`, recording every problem: a value that is not a list, an element that
/// is not a string literal, an empty list, a template written twice, and each template's own errors.
fn key_templates(value: &Expr, errors: &mut Errors) -> Vec<TemplateArg> {
    let example = "e.g. `keys = [\"account:<from>\", \"account:<to>\"]`";
    let Expr::Array(ExprArray { elems, .. }) = value else {
        errors.push(syn::Error::new_spanned(
            value,
            format!("`keys` must be a list of string literal templates, {example}; for one lock write `key = \"..\"`"),
        ));
        return Vec::new();
    };
    if elems.is_empty() {
        errors.push(syn::Error::new_spanned(
            value,
            format!("`keys` needs at least one key template, {example}; for one lock write `key = \"..\"`"),
        ));
        return Vec::new();
    }
    let mut templates: Vec<TemplateArg> = Vec::with_capacity(elems.len());
    for elem in elems {
        let lit = match elem {
            Expr::Lit(ExprLit { lit: Lit::Str(lit), attrs }) if attrs.is_empty() => lit.clone(),
            other => {
                errors.push(syn::Error::new_spanned(
                    other,
                    format!(
                        "each of `keys` must be a string literal template such as \"account:<from>\", checked at \
                         compile time; {example}"
                    ),
                ));
                continue;
            }
        };
        if templates.iter().any(|t| t.lit.value() == lit.value()) {
            errors.push(syn::Error::new(
                lit.span(),
                format!(
                    "duplicate template {:?} in `keys`: it names the same lock as the one before; remove it \
                     (keys that only render alike at run time, such as `<from>` and `<to>` with equal values, \
                     are merged into one lock)",
                    lit.value()
                ),
            ));
            continue;
        }
        templates.push(TemplateArg::parse(TemplateKind::Key, lit, errors));
    }
    templates
}

/// Returns the string literal of an argument, or records an error on the value.
fn string_literal(name: &str, value: &Expr, errors: &mut Errors) -> Option<LitStr> {
    if let Expr::Lit(ExprLit { lit: Lit::Str(lit), attrs }) = value {
        if attrs.is_empty() {
            return Some(lit.clone());
        }
    }
    let message = match name {
        "key" => "`key` must be a string literal such as \"report:<id>\": the template is checked at compile time; \
                  put parameters in it as `<name>` placeholders instead of formatting the key yourself"
            .to_owned(),
        "ttl" | "wait" | "min_hold" | "max_hold" => {
            format!("`{name}` must be a string literal duration such as \"500ms\", \"5s\", \"2m\", \"1h\" or \"1m30s\"")
        }
        "on_lost" => "`on_lost` must be the string literal \"abort\" or \"continue\"".to_owned(),
        "retry" => {
            "`retry` must be a string literal such as \"none\", \"linear 100ms\" or \"exponential 25ms..1s\"".to_owned()
        }
        "metadata" => "`metadata` must be a string literal such as \"replica <replica>\": the template is checked at \
                       compile time, like `key`'s"
            .to_owned(),
        _ => "`crate` must be a string literal path, such as \"distlock\"".to_owned(),
    };
    errors.push(syn::Error::new_spanned(value, message));
    None
}

/// Parses a duration argument, recording an error on the literal if it is invalid.
fn duration(name: &str, lit: &LitStr, errors: &mut Errors) -> Option<u64> {
    match parse_duration(&lit.value()) {
        Ok(ms) => Some(ms),
        Err(e) => {
            errors.push(syn::Error::new(lit.span(), format!("invalid `{name}`: {e}")));
            None
        }
    }
}

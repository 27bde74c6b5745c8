//! Checks of the annotated function: `async`, not `const`, has a return type, and every placeholder of its
//! templates (`key`, `metadata`) names one of its parameters (with a suggestion when it does not).

use std::ops::Range;

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, LitStr, Member, Pat, ReturnType, Type};

use crate::parse::TemplateArg;
use crate::template::Segment;
use crate::Errors;

/// Checks the function's shape and the templates' placeholders against its parameters.
pub(crate) fn validate_fn<'a>(
    item: &ItemFn,
    templates: impl IntoIterator<Item = &'a TemplateArg>,
    errors: &mut Errors,
) {
    let bindings = collect_bindings(item);
    for template in templates {
        check_placeholders(item, &bindings, template, errors);
    }
    let sig = &item.sig;
    let name = sig.ident.unraw().to_string();
    if let Some(constness) = &sig.constness {
        errors.push(syn::Error::new(
            constness.span,
            "`#[distributed_lock]` cannot be used on a `const fn`: taking a lock happens at run time; \
             remove `const` and make it an `async fn`",
        ));
    } else if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            format!(
                "`#[distributed_lock]` requires an `async fn`: the lock is held while the body runs and awaits; \
                 write `async fn {name}`"
            ),
        ));
    }
    let unit_return = match &sig.output {
        ReturnType::Default => Some(sig.ident.span()),
        ReturnType::Type(_, ty) => match &**ty {
            Type::Tuple(tuple) if tuple.elems.is_empty() => Some(ty.span()),
            _ => None,
        },
    };
    if let Some(span) = unit_return {
        errors.push(syn::Error::new(
            span,
            format!(
                "`{name}` must return `Result<_, E>` where `E: From<distlock::LockError>`, so that a busy, lost or \
                 unconfigured lock can be reported to the caller; e.g. `-> Result<(), distlock::LockError>`"
            ),
        ));
    }
}

/// A name a placeholder may refer to.
enum Binding {
    /// A whole parameter (or the `self` receiver).
    Param(String),
    /// A name bound inside a parameter's pattern, with the field path leading to it (if it has one) and the
    /// parameter's type.
    InPattern { name: String, path: Option<Vec<String>>, ty: String },
}

fn check_placeholders(item: &ItemFn, bindings: &[Binding], template: &TemplateArg, errors: &mut Errors) {
    let params: Vec<&str> = bindings
        .iter()
        .filter_map(|b| match b {
            Binding::Param(name) => Some(name.as_str()),
            Binding::InPattern { .. } => None,
        })
        .collect();
    let fn_name = item.sig.ident.unraw().to_string();
    for segment in &template.template.segments {
        let Segment::Placeholder(placeholder) = segment else { continue };
        let Some(first) = placeholder.path.first().map(|name| unraw(name)) else { continue };
        let written = placeholder.display();
        let span = span_in(&template.lit, placeholder.range.clone());
        let found = bindings.iter().find(|b| match b {
            Binding::Param(name) | Binding::InPattern { name, .. } => *name == first,
        });
        let message = match found {
            Some(Binding::Param(_)) => continue,
            Some(Binding::InPattern { path, ty, .. }) => {
                let mut rest = placeholder.path[1..].to_vec();
                let suggestion = match path {
                    Some(path) => {
                        let mut full = vec!["arg".to_owned()];
                        full.extend(path.iter().cloned());
                        full.append(&mut rest);
                        format!(", and write `<{}>`", full.join("."))
                    }
                    None => String::new(),
                };
                format!(
                    "placeholder `{written}` names `{first}`, which is bound by a pattern in `{fn_name}`'s parameters, \
                     not a parameter itself; bind the whole parameter to a name, e.g. `arg: {ty}`{suggestion}"
                )
            }
            None if first == "self" => format!(
                "placeholder `{written}` uses `self`, but `{fn_name}` has no `self` parameter; {}",
                param_list(&params)
            ),
            None => {
                let hint = closest(&first, params.iter().copied())
                    .map(|c| format!("did you mean `{c}`? "))
                    .unwrap_or_default();
                format!(
                    "unknown placeholder `{written}`: `{fn_name}` has no parameter `{first}`; {hint}{}",
                    param_list(&params)
                )
            }
        };
        errors.push(syn::Error::new(span, message));
    }
}

fn param_list(params: &[&str]) -> String {
    if params.is_empty() {
        "the function has no parameters".to_owned()
    } else {
        format!("parameters: {}", params.join(", "))
    }
}

fn unraw(name: &str) -> String {
    name.strip_prefix("r#").unwrap_or(name).to_owned()
}

fn collect_bindings(item: &ItemFn) -> Vec<Binding> {
    let mut bindings = Vec::new();
    for input in &item.sig.inputs {
        match input {
            FnArg::Receiver(_) => bindings.push(Binding::Param("self".to_owned())),
            FnArg::Typed(pat_type) => {
                let ty = pretty(pat_type.ty.to_token_stream());
                match &*pat_type.pat {
                    Pat::Ident(pat_ident) => {
                        bindings.push(Binding::Param(pat_ident.ident.unraw().to_string()));
                        if let Some((_, sub)) = &pat_ident.subpat {
                            pattern_bindings(sub, Some(Vec::new()), &ty, &mut bindings);
                        }
                    }
                    pat => pattern_bindings(pat, Some(Vec::new()), &ty, &mut bindings),
                }
            }
        }
    }
    bindings
}

/// Records the names bound inside `pat`; `path` is the field path from the parameter to `pat`, if any.
fn pattern_bindings(pat: &Pat, path: Option<Vec<String>>, ty: &str, out: &mut Vec<Binding>) {
    let extend = |segment: String| {
        path.clone().map(|mut p| {
            p.push(segment);
            p
        })
    };
    match pat {
        Pat::Ident(pat_ident) => {
            let name = pat_ident.ident.unraw().to_string();
            out.push(Binding::InPattern { name, path: path.clone(), ty: ty.to_owned() });
            if let Some((_, sub)) = &pat_ident.subpat {
                pattern_bindings(sub, path, ty, out);
            }
        }
        Pat::Tuple(tuple) => {
            for (i, elem) in tuple.elems.iter().enumerate() {
                pattern_bindings(elem, extend(i.to_string()), ty, out);
            }
        }
        Pat::TupleStruct(tuple) => {
            for (i, elem) in tuple.elems.iter().enumerate() {
                pattern_bindings(elem, extend(i.to_string()), ty, out);
            }
        }
        Pat::Struct(strukt) => {
            for field in &strukt.fields {
                let member = match &field.member {
                    Member::Named(ident) => ident.unraw().to_string(),
                    Member::Unnamed(index) => index.index.to_string(),
                };
                pattern_bindings(&field.pat, extend(member), ty, out);
            }
        }
        Pat::Reference(reference) => pattern_bindings(&reference.pat, path, ty, out),
        Pat::Paren(paren) => pattern_bindings(&paren.pat, path, ty, out),
        Pat::Type(typed) => pattern_bindings(&typed.pat, path, ty, out),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| pattern_bindings(p, None, ty, out)),
        Pat::Or(or) => or.cases.iter().for_each(|p| pattern_bindings(p, None, ty, out)),
        _ => {}
    }
}

/// Renders tokens the way people write them (`(u8, u8)`, `Vec<String>`, `&'a str`), for messages.
fn pretty(tokens: TokenStream) -> String {
    let mut out = String::new();
    for token in tokens {
        let text = match &token {
            TokenTree::Group(group) => {
                let (open, close) = match group.delimiter() {
                    proc_macro2::Delimiter::Parenthesis => ("(", ")"),
                    proc_macro2::Delimiter::Bracket => ("[", "]"),
                    proc_macro2::Delimiter::Brace => ("{ ", " }"),
                    proc_macro2::Delimiter::None => ("", ""),
                };
                format!("{open}{}{close}", pretty(group.stream()))
            }
            other => other.to_string(),
        };
        let glue = out.is_empty()
            || out.ends_with(['<', '&', '(', '[', '\'', ':'])
            || text.starts_with([',', '>', ':', ';'])
            || (text.starts_with(['(', '[', '<']) && out.ends_with(|c: char| c.is_alphanumeric()));
        if !glue {
            out.push(' ');
        }
        out.push_str(&text);
    }
    out
}

/// Points into a string literal at `range` (byte offsets in its value) when the compiler allows it, otherwise
/// at the whole literal. Sub-spans need the literal's source to match its value, so escapes and raw strings
/// fall back to the literal's span.
pub(crate) fn span_in(lit: &LitStr, range: Range<usize>) -> Span {
    let token = lit.token();
    let source = token.to_string();
    let value = lit.value();
    if source.len() == value.len() + 2
        && source.get(1..source.len() - 1) == Some(value.as_str())
        && !source.contains('\\')
    {
        if let Some(span) = token.subspan(range.start + 1..range.end + 1) {
            return span;
        }
    }
    lit.span()
}

/// The candidate closest to `name` by edit distance, if it is close enough to be a likely typo.
pub(crate) fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|candidate| (edit_distance(name, candidate), candidate))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance (insertions, deletions and substitutions each cost 1), over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != *cb);
            current.push(substitute.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    #[test]
    fn distance() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("id", "ide"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("ttl", "tll"), 1);
        assert_eq!(edit_distance("abc", ""), 3);
    }

    #[test]
    fn suggestions() {
        assert_eq!(closest("ide", ["id", "tenant"]), Some("id"));
        assert_eq!(closest("tenat", ["id", "tenant"]), Some("tenant"));
        assert_eq!(closest("tll", ["key", "ttl", "wait"]), Some("ttl"));
        assert_eq!(closest("zzz", ["id", "tenant"]), None);
        assert_eq!(closest("x", Vec::<&str>::new()), None);
    }

    #[test]
    fn pretty_types() {
        assert_eq!(pretty(quote!((u8, u8))), "(u8, u8)");
        assert_eq!(pretty(quote!(Vec<String>)), "Vec<String>");
        assert_eq!(pretty(quote!(&'a str)), "&'a str");
        assert_eq!(pretty(quote!(std::collections::HashMap<u8, Vec<u8>>)), "std::collections::HashMap<u8, Vec<u8>>");
        assert_eq!(pretty(quote!([u8; 4])), "[u8; 4]");
    }
}

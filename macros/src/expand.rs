//! Code generation: rewrites the `async fn` so that its body runs under the lock.
//!
//! ```text
//! #[attrs] vis async fn name<G>(params) -> R where .. {
//!     #![inner attrs]
//!     let key = { let mut buf = path::TemplateBuf::key(); buf.push_literal("report:"); buf.push_value(&id); buf.finish() };
//!     let metadata = { let mut buf = path::TemplateBuf::text(); buf.push_literal(concat!(module_path!(), "::name")); buf.finish() };
//!     static SPEC: path::LockSpec = path::LockSpec { function: concat!(module_path!(), "::name"), ttl: .., .. };
//!     path::run_locked(&SPEC, key, metadata, async move {  // spanned on `R`: `R: LockedReturn` is checked here
//!         if false { let fake: R = loop {}; return fake; }   // pins the block's output type to `R`
//!         original body statements
//!     }).await
//! }
//! ```
//!
//! With `keys = [..]`, `key` is an array of the rendered keys, `[{ .. }, { .. }]`, and the call is
//! `path::run_locked_all` (the same, through `Client::lock_all`).
//!
//! The return type is not inspected (only `-> impl Trait`, never a `Result`, is refused here): `run_locked`'s
//! `R: LockedReturn` bound reports a wrong one, once, on the return type, with the runtime's `on_unimplemented`
//! message.
//!
//! `path` is `::distlock::__private` (or `<crate>::__private`); generated local names use
//! `Span::mixed_site()` so they cannot clash with the user's names.

use proc_macro2::{Literal, Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{AttrStyle, Ident, Index, ItemFn, ReturnType, TraitItemFn, Type};

use crate::parse::{parse_args, Args, OnLost, TemplateArg};
use crate::retry::Retry;
use crate::template::{Placeholder, Segment};
use crate::validate::{span_in, validate_fn};
use crate::Errors;

/// Entry point: parses, validates and expands; on any error returns the errors beside the unchanged item.
pub(crate) fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let args = parse_args(args, &mut errors);
    let function = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(function) => function,
        Err(error) => {
            errors.push(not_a_function(&item, error));
            return with_errors(errors, item);
        }
    };
    validate_fn(&function, args.templates(), &mut errors);
    if !errors.is_empty() {
        return with_errors(errors, item);
    }
    match generate(&function, &args) {
        Ok(tokens) => tokens,
        Err(error) => {
            errors.push(error);
            with_errors(errors, item)
        }
    }
}

/// The compile errors followed by the original item, untouched, so the rest of the crate still type-checks.
fn with_errors(mut errors: Errors, item: TokenStream) -> TokenStream {
    let errors = errors.take().map(|e| e.to_compile_error());
    quote!(#errors #item)
}

fn not_a_function(item: &TokenStream, error: syn::Error) -> syn::Error {
    if let Ok(declaration) = syn::parse2::<TraitItemFn>(item.clone()) {
        if declaration.default.is_none() {
            return syn::Error::new(
                declaration.sig.ident.span(),
                "`#[distributed_lock]` needs a function body: put it on the `async fn` in the `impl`, \
                 not on the trait's declaration",
            );
        }
    }
    syn::Error::new(
        error.span(),
        format!("`#[distributed_lock]` can only be applied to an `async fn` with a body ({error})"),
    )
}

fn generate(function: &ItemFn, args: &Args) -> syn::Result<TokenStream> {
    let key_templates: Vec<&TemplateArg> = match (&args.key, &args.keys) {
        (Some(key), _) => vec![key],
        (None, Some(keys)) if !keys.is_empty() => keys.iter().collect(),
        // Rejected by parsing; kept total for safety.
        _ => return Err(syn::Error::new(Span::call_site(), "missing required argument `key`")),
    };
    let ItemFn { attrs, vis, sig, block } = function;
    let outer = attrs.iter().filter(|a| matches!(a.style, AttrStyle::Outer));
    let inner = attrs.iter().filter(|a| matches!(a.style, AttrStyle::Inner(_)));
    let private = match &args.krate {
        Some(path) => quote!(#path::__private),
        None => quote!(::distlock::__private),
    };

    let return_type = match &sig.output {
        ReturnType::Type(_, ty) => &**ty,
        // Rejected by validation; kept total for safety.
        ReturnType::Default => return Err(syn::Error::new(sig.ident.span(), "missing return type")),
    };
    if is_impl_trait(return_type) {
        // `impl Trait` cannot be named inside the body, and is never a `Result`: say so ourselves.
        return Err(syn::Error::new_spanned(
            return_type,
            format!(
                "`{}` must return `Result<_, E>` where `E: From<distlock::LockError>`, so that a busy, lost or \
                 unconfigured lock can be reported to the caller",
                syn::ext::IdentExt::unraw(&sig.ident)
            ),
        ));
    }
    // The first token of the return type (what `Spanned::span` gives on stable).
    let return_start = return_type.span();
    let mut erased = return_type.clone();
    EraseImplTrait.visit_type_mut(&mut erased);

    let key_var = Ident::new("__distlock_key", Span::mixed_site());
    let new_key = quote!(#private::TemplateBuf::key());
    let rendered = key_templates.iter().map(|key| render(key, &new_key)).collect::<syn::Result<Vec<_>>>()?;
    let (render_key, run) = match args.keys {
        Some(_) => (quote!([#(#rendered),*]), Ident::new("run_locked_all", return_start)),
        None => (quote!(#(#rendered)*), Ident::new("run_locked", return_start)),
    };
    let metadata_var = Ident::new("__distlock_metadata", Span::mixed_site());
    let text = quote!(#private::TemplateBuf::text());
    let name = syn::ext::IdentExt::unraw(&sig.ident).to_string();
    // The function's path: the default metadata, and the `function` field of the lock's span.
    let function_path = quote!(::core::concat!(::core::module_path!(), "::", #name));
    let render_metadata = match &args.metadata {
        Some(metadata) => render(metadata, &text)?,
        None => render_pushes(&text, vec![Push::Literal(function_path.clone())]),
    };
    let spec_var = Ident::new("__DISTLOCK_SPEC", Span::mixed_site());
    let spec = lock_spec(args, &private, &function_path);
    let fake = Ident::new("__distlock_fake_return", Span::mixed_site());
    // The statements, not the block: `async move { edge; { expr } }` would trip the `unused_braces` lint.
    let body = &block.stmts;
    let fake_return_edge = quote_spanned! {return_start=>
        #[allow(
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::let_unit_value,
            clippy::needless_return,
            clippy::unreachable
        )]
        if false {
            let #fake: #erased = loop {};
            return #fake;
        }
    };

    // Spanned on the return type, where a return type that is not a valid `Result` is then reported: the call
    // (through the `R: LockedReturn` bound) and its `.await` (through the same bound on the returned future) get
    // this one span, so that the compiler merges their identical errors into one.
    let private_at_return = respan(private.clone(), return_start);
    let run_locked = quote_spanned! {return_start=>
        #private_at_return::#run(&#spec_var, #key_var, #metadata_var, async move {
            #fake_return_edge
            #(#body)*
        })
        .await
    };

    Ok(quote! {
        #(#outer)*
        #vis #sig {
            #(#inner)*
            let #key_var = #render_key;
            let #metadata_var = #render_metadata;
            static #spec_var: #private::LockSpec = #spec;
            #run_locked
        }
    })
}

/// Whether the type is `impl Trait` (possibly in parentheses).
fn is_impl_trait(ty: &Type) -> bool {
    match ty {
        Type::Paren(paren) => is_impl_trait(&paren.elem),
        Type::Group(group) => is_impl_trait(&group.elem),
        Type::ImplTrait(_) => true,
        _ => false,
    }
}

/// The template rendered at run time into the `TemplateBuf` that `new` makes (a key's, or metadata's).
fn render(template: &TemplateArg, new: &TokenStream) -> syn::Result<TokenStream> {
    let mut pushes = Vec::new();
    for segment in &template.template.segments {
        pushes.push(match segment {
            Segment::Text(text) => Push::Literal(quote!(#text)),
            Segment::Placeholder(placeholder) => {
                let span = span_in(&template.lit, placeholder.range.clone());
                Push::Value(placeholder_expr(placeholder, span)?, span)
            }
        });
    }
    Ok(render_pushes(new, pushes))
}

/// One step of rendering a template.
enum Push {
    /// Text, as an expression of type `&str`.
    Literal(TokenStream),
    /// A placeholder's value, and the placeholder's span in the template.
    Value(TokenStream, Span),
}

/// `{ let mut buf = <new>; buf.push_literal(..); buf.push_value(&..); buf.finish() }`.
fn render_pushes(new: &TokenStream, pushes: Vec<Push>) -> TokenStream {
    let buf = Ident::new("__distlock_buf", Span::mixed_site());
    let pushes = pushes.into_iter().map(|push| match push {
        Push::Literal(text) => quote!(#buf.push_literal(#text);),
        // Spanned on the placeholder so that a value that is not `Display` is reported there.
        Push::Value(value, span) => quote_spanned!(span=> #buf.push_value(&#value);),
    });
    quote! {{
        let mut #buf = #new;
        #(#pushes)*
        #buf.finish()
    }}
}

/// The expression a placeholder stands for, e.g. `req.user.id` or `self.tenant`, with the user's hygiene.
fn placeholder_expr(placeholder: &Placeholder, span: Span) -> syn::Result<TokenStream> {
    let invalid = || syn::Error::new(span, format!("invalid placeholder `{}`", placeholder.display()));
    let mut tokens = TokenStream::new();
    for (index, segment) in placeholder.path.iter().enumerate() {
        if index > 0 {
            tokens.extend(quote_spanned!(span=> .));
        }
        if index == 0 && segment == "self" {
            tokens.extend(quote_spanned!(span=> self));
        } else if index > 0 && segment.bytes().all(|b| b.is_ascii_digit()) {
            let index: u32 = segment.parse().map_err(|_| invalid())?;
            Index { index, span }.to_tokens(&mut tokens);
        } else {
            let mut ident = syn::parse_str::<Ident>(segment)
                .or_else(|_| syn::parse_str::<Ident>(&format!("r#{segment}")))
                .map_err(|_| invalid())?;
            ident.set_span(span);
            ident.to_tokens(&mut tokens);
        }
    }
    Ok(tokens)
}

/// The `LockSpec { .. }` constant expression.
fn lock_spec(args: &Args, private: &TokenStream, function: &TokenStream) -> TokenStream {
    let millis = |ms: u64| {
        let ms = Literal::u64_suffixed(ms);
        quote!(#private::Duration::from_millis(#ms))
    };
    let ttl = millis(args.ttl_ms);
    let wait = millis(args.wait_ms);
    let optional = |value: Option<TokenStream>| match value {
        Some(value) => quote!(::core::option::Option::Some(#value)),
        None => quote!(::core::option::Option::None),
    };
    let retry = optional(args.retry.map(|retry| match retry {
        Retry::None => quote!(#private::RetryStrategy::None),
        Retry::Linear { step_ms } => {
            let step = millis(step_ms);
            quote!(#private::RetryStrategy::Linear { step: #step })
        }
        Retry::Exponential { base_ms, max_ms } => {
            let (base, max) = (millis(base_ms), millis(max_ms));
            quote!(#private::RetryStrategy::Exponential { base: #base, max: #max })
        }
    }));
    let min_hold = optional(args.min_hold_ms.map(millis));
    let max_hold = optional(args.max_hold_ms.map(millis));
    let on_lost = match args.on_lost {
        OnLost::Abort => quote!(#private::OnLost::Abort),
        OnLost::Continue => quote!(#private::OnLost::Continue),
    };
    quote! {
        #private::LockSpec {
            function: #function,
            ttl: #ttl,
            wait: #wait,
            retry: #retry,
            min_hold: #min_hold,
            max_hold: #max_hold,
            on_lost: #on_lost,
        }
    }
}

/// `tokens` with every span set to `span` (same hygiene: both are spans of the user's code).
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let proc_macro2::TokenTree::Group(group) = &token {
                let mut new = proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                new.set_span(span);
                token = new.into();
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}

/// Replaces `impl Trait` with `_` (not allowed in a `let` type).
struct EraseImplTrait;

impl VisitMut for EraseImplTrait {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        if let Type::ImplTrait(impl_trait) = ty {
            *ty = Type::Infer(syn::TypeInfer { underscore_token: syn::Token![_](impl_trait.span()) });
        } else {
            syn::visit_mut::visit_type_mut(self, ty);
        }
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::lock_spec;
    use crate::parse::parse_args;
    use crate::Errors;

    fn spec(args: proc_macro2::TokenStream) -> String {
        let mut errors = Errors::default();
        let args = parse_args(args, &mut errors);
        assert!(errors.is_empty(), "{:?}", errors.take());
        lock_spec(&args, &quote!(p), &quote!("m::f")).to_string().replace(' ', "")
    }

    /// Each `retry` form names the runtime's variant with every field; the hold limits and the function's path are
    /// passed as given.
    #[test]
    fn retry_and_hold_limits_reach_the_spec() {
        let some = |inner: &str| format!("::core::option::Option::Some({inner})");
        let ms = |n: u64| format!("p::Duration::from_millis({n}u64)");
        let cases = [
            ("none", "p::RetryStrategy::None".to_owned()),
            ("linear 100ms", format!("p::RetryStrategy::Linear{{step:{}}}", ms(100))),
            ("exponential 10ms..1s", format!("p::RetryStrategy::Exponential{{base:{},max:{}}}", ms(10), ms(1000))),
        ];
        for (retry, expected) in cases {
            let spec = spec(quote!(key = "k", retry = #retry));
            assert!(spec.contains(&format!("retry:{},", some(&expected))), "{retry}: {spec}");
            assert!(spec.contains("min_hold:::core::option::Option::None,"), "{spec}");
            assert!(spec.contains("max_hold:::core::option::Option::None,"), "{spec}");
        }
        let spec = spec(quote!(key = "k", min_hold = "2s", max_hold = "1m"));
        assert!(spec.contains("function:\"m::f\","), "the function's path reaches the span: {spec}");
        assert!(spec.contains("retry:::core::option::Option::None,"), "{spec}");
        assert!(spec.contains(&format!("min_hold:{},", some(&ms(2000)))), "{spec}");
        assert!(spec.contains(&format!("max_hold:{},", some(&ms(60_000)))), "{spec}");
    }
}

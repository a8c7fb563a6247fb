//! An `async fn` that another attribute rewrote before this one ran: the
//! shape `#[async_trait]` gives every `async fn` of a trait impl, found the
//! way `tracing::instrument` finds it.
//!
//! Inside `#[async_trait] impl Service for MyService { .. }` the impl's
//! attribute expands first, so `#[distributed_lock]` on a method receives
//!
//! ```text
//! fn call<'life0, 'async_trait>(&'life0 self, id: u64)
//!     -> Pin<Box<dyn Future<Output = Result<Reply, Status>> + Send + 'async_trait>>
//! where ..
//! {
//!     Box::pin(async move {
//!         let __self = self;
//!         let id = id;
//!         let (a, b) = { let __arg2 = __arg2; __arg2 };   // a destructured parameter
//!         let __ret: Result<Reply, Status> = { /* the body, `self` as `__self` */ };
//!         __ret
//!     })
//! }
//! ```
//!
//! The function is kept as it is, and its last expression, `Box::pin(async
//! move { .. })` (or a bare `async move { .. }`), becomes
//! `Box::pin(async move { run(lock, .., async move { .. }, ..).await })`: the
//! lock is built from the function's parameters as written in the signature
//! (`self` is still `self` there), taken, and the future async-trait made is
//! the body. Only the outer shape is relied on, as tracing does: what
//! async-trait puts inside the block is left alone, but for reading back the
//! patterns of destructured parameters (`__arg2` above) so that a key can
//! name what they bind.

use proc_macro2::TokenStream;
use quote::quote;
use syn::visit_mut::VisitMut;
use syn::{Block, Expr, ExprAsync, FnArg, Ident, Pat, ReturnType, Signature, Stmt, Type};

/// A function returning a future made by an async block, its last
/// expression.
pub(crate) struct BoxedFuture<'a> {
    /// The signature as the `async fn` was written, near enough for the key
    /// and the return type: `async`, `-> T` (the future's `Output`), and the
    /// destructuring patterns back in place of `__argN`.
    pub(crate) written: Signature,
    /// The statements before the last expression (none from async-trait).
    pub(crate) before: &'a [Stmt],
    /// `Box::pin` as written (its path), or `None` for a bare async block.
    pub(crate) pin: Option<&'a Expr>,
    /// The async block: the body the lock is held around.
    pub(crate) future: &'a ExprAsync,
    /// `let <pattern> = &__argN;` for every destructured parameter: what
    /// lets the key and the `client` expression use the names it binds.
    pub(crate) bindings: Vec<TokenStream>,
}

/// `Some` when `sig`/`block` is a non-async function whose last expression
/// is `Box::pin(async { .. })` or `async { .. }` and whose return type names
/// a `Future<Output = T>`.
pub(crate) fn recognize<'a>(sig: &Signature, block: &'a Block) -> Option<BoxedFuture<'a>> {
    if sig.asyncness.is_some() {
        return None;
    }
    let (last, before) = block.stmts.split_last()?;
    let Stmt::Expr(last, None) = last else {
        return None;
    };
    let (pin, future) = match last {
        Expr::Async(future) => (None, future),
        Expr::Call(call) => {
            let Expr::Path(path) = call.func.as_ref() else {
                return None;
            };
            let segments: Vec<String> = path
                .path
                .segments
                .iter()
                .map(|segment| segment.ident.to_string())
                .collect();
            if !segments.ends_with(&["Box".to_owned(), "pin".to_owned()]) || call.args.len() != 1 {
                return None;
            }
            let Some(Expr::Async(future)) = call.args.first() else {
                return None;
            };
            (Some(call.func.as_ref()), future)
        }
        _ => return None,
    };
    let output = match &sig.output {
        ReturnType::Type(_, ty) => future_output(ty)?,
        ReturnType::Default => return None,
    };
    let mut written = sig.clone();
    written.asyncness = Some(syn::token::Async::default());
    written.output = ReturnType::Type(Default::default(), Box::new(output.clone()));
    let mut bindings = Vec::new();
    for input in &mut written.inputs {
        let FnArg::Typed(typed) = input else {
            continue;
        };
        let Pat::Ident(positional) = typed.pat.as_ref() else {
            continue;
        };
        let Some(pattern) = destructured(&future.block, &positional.ident) else {
            continue;
        };
        let argument = &positional.ident;
        let mut borrowed = pattern.clone();
        StripBindingModes.visit_pat_mut(&mut borrowed);
        bindings.push(quote!(#[allow(unused_variables)] let #borrowed = &#argument;));
        *typed.pat = pattern;
    }
    Some(BoxedFuture {
        written,
        before,
        pin,
        future,
        bindings,
    })
}

/// Whether `sig` returns a `Future<Output = T>`: a function the attribute
/// would take if its last expression were an async block.
pub(crate) fn returns_future(sig: &Signature) -> bool {
    matches!(&sig.output, ReturnType::Type(_, ty) if future_output(ty).is_some())
}

/// `T` in a return type naming `Future<Output = T>` anywhere (`Pin<Box<dyn
/// Future<Output = T> + Send + 'a>>`, `impl Future<Output = T>`).
fn future_output(ty: &Type) -> Option<&Type> {
    let bounds = match ty {
        Type::TraitObject(object) => &object.bounds,
        Type::ImplTrait(opaque) => &opaque.bounds,
        Type::Paren(inner) => return future_output(&inner.elem),
        Type::Group(inner) => return future_output(&inner.elem),
        Type::Path(path) => {
            let last = path.path.segments.last()?;
            let syn::PathArguments::AngleBracketed(arguments) = &last.arguments else {
                return None;
            };
            return arguments.args.iter().find_map(|argument| match argument {
                syn::GenericArgument::Type(inner) => future_output(inner),
                _ => None,
            });
        }
        _ => return None,
    };
    bounds.iter().find_map(|bound| {
        let syn::TypeParamBound::Trait(bound) = bound else {
            return None;
        };
        let last = bound.path.segments.last()?;
        if last.ident != "Future" {
            return None;
        }
        let syn::PathArguments::AngleBracketed(arguments) = &last.arguments else {
            return None;
        };
        arguments.args.iter().find_map(|argument| match argument {
            syn::GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(&assoc.ty),
            _ => None,
        })
    })
}

/// The pattern async-trait moved out of the signature for the parameter it
/// renamed `argument`: the statement `let <pattern> = { let __argN = __argN;
/// __argN };` (or `let <pattern> = __argN;`, older versions) in its block.
fn destructured(block: &Block, argument: &Ident) -> Option<Pat> {
    let name = argument.to_string();
    if !name.starts_with("__arg") {
        return None;
    }
    let names_argument =
        |expr: &Expr| matches!(expr, Expr::Path(path) if path.path.is_ident(&name));
    block.stmts.iter().find_map(|stmt| {
        let Stmt::Local(local) = stmt else {
            return None;
        };
        let init = &local.init.as_ref()?.expr;
        let moved = match init.as_ref() {
            Expr::Block(inner) => match inner.block.stmts.last() {
                Some(Stmt::Expr(expr, None)) => names_argument(expr),
                _ => false,
            },
            expr => names_argument(expr),
        };
        moved.then(|| local.pat.clone())
    })
}

/// `ref` and `mut` dropped from every binding: the pattern is matched
/// against a reference (`let (a, b) = &__arg1;`), where the default binding
/// mode already borrows.
struct StripBindingModes;

impl VisitMut for StripBindingModes {
    fn visit_pat_ident_mut(&mut self, ident: &mut syn::PatIdent) {
        ident.by_ref = None;
        ident.mutability = None;
        syn::visit_mut::visit_pat_ident_mut(self, ident);
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;
    use syn::ItemFn;

    use super::recognize;

    fn function(tokens: proc_macro2::TokenStream) -> ItemFn {
        syn::parse2(tokens).unwrap()
    }

    #[test]
    fn async_trait_shape_gives_the_written_signature() {
        let item = function(quote! {
            fn call<'life0, 'async_trait>(&'life0 self, id: u64, __arg2: (u32, u32))
                -> ::core::pin::Pin<Box<dyn ::core::future::Future<Output = Result<u8, E>>
                    + ::core::marker::Send + 'async_trait>>
            where 'life0: 'async_trait, Self: 'async_trait
            {
                Box::pin(async move {
                    let __self = self;
                    let id = id;
                    let (a, mut b) = { let __arg2 = __arg2; __arg2 };
                    let __ret: Result<u8, E> = { Ok(1) };
                    __ret
                })
            }
        });
        let found = recognize(&item.sig, &item.block).expect("recognized");
        let written = &found.written;
        assert!(written.asyncness.is_some());
        let output = &written.output;
        assert_eq!(quote!(#output).to_string(), "-> Result < u8 , E >");
        let inputs = &written.inputs;
        assert_eq!(
            quote!(#inputs).to_string(),
            "& 'life0 self , id : u64 , (a , mut b) : (u32 , u32)"
        );
        assert!(found.pin.is_some());
        let bindings = &found.bindings;
        assert_eq!(
            quote!(#(#bindings)*).to_string(),
            "# [allow (unused_variables)] let (a , b) = & __arg2 ;"
        );
    }

    #[test]
    fn a_bare_async_block_and_impl_future() {
        let item = function(quote! {
            fn call(id: u64) -> impl Future<Output = ()> + Send { async move { work(id).await } }
        });
        let found = recognize(&item.sig, &item.block).expect("recognized");
        assert!(found.pin.is_none());
        let output = &found.written.output;
        assert_eq!(quote!(#output).to_string(), "-> ()");
    }

    #[test]
    fn other_functions_are_not_recognized() {
        for item in [
            quote!(
                async fn call() {}
            ),
            quote!(
                fn call() {}
            ),
            quote!(
                fn call() -> u8 {
                    1
                }
            ),
            quote!(
                fn call() -> Pin<Box<dyn Future<Output = ()>>> {
                    Box::pin(ready(()))
                }
            ),
            quote!(
                fn call() -> Pin<Box<dyn Future<Output = ()>>> {
                    Box::pin(async move {});
                }
            ),
            quote!(
                fn call() -> Vec<u8> {
                    async move {}
                }
            ),
        ] {
            let item = function(item);
            assert!(
                recognize(&item.sig, &item.block).is_none(),
                "{}",
                quote!(#item)
            );
        }
    }
}

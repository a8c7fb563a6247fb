//! Turning the annotated function into one call of the runtime.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{ItemFn, LitStr};

use crate::args::{ArgsParser, LockArgs, LockKind};
use crate::boxed_future;
use crate::key_template::parse_key;
use crate::return_kind::check_return_type;

/// Expands `#[distributed_lock(args)] item`. On error, the error is emitted
/// beside the unchanged function (as tokio-macros and tracing-attributes do),
/// so that no further errors cascade from it: callers still see the function
/// and its signature.
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let function: ItemFn = match syn::parse2(item.clone()) {
        Ok(function) => function,
        Err(error) => {
            let error = syn::Error::new(
                error.span(),
                format!("#[distributed_lock] goes on an `async fn` with a body: {error}"),
            );
            return error_beside(error, item);
        }
    };
    match parse_args(args).and_then(|args| rewrite(args, &function)) {
        Ok(tokens) => tokens,
        // The function as written, without the key and the `client`
        // expression that would have used its parameters: `unused variable`
        // warnings there would only hide the error.
        Err(error) => error_beside(error, quote!(#[allow(unused_variables)] #function)),
    }
}

fn error_beside(error: syn::Error, item: TokenStream) -> TokenStream {
    let error = error.to_compile_error();
    quote!(#error #item)
}

fn parse_args(args: TokenStream) -> syn::Result<LockArgs> {
    let mut parser = ArgsParser::default();
    syn::meta::parser(|meta| parser.parse(meta)).parse2(args)?;
    parser.finish()
}

fn rewrite(args: LockArgs, function: &ItemFn) -> syn::Result<TokenStream> {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    // An `async fn` rewritten by an attribute that ran first (`#[async_trait]`
    // on the impl): the key and return type are read from the signature as
    // written, and the lock is held around the future it returns.
    let boxed = boxed_future::recognize(sig, block);
    if sig.asyncness.is_none() && boxed.is_none() {
        let message = if boxed_future::returns_future(sig) {
            "#[distributed_lock] on a function returning a future needs an async block as its \
             last expression (`async move { .. }` or `Box::pin(async move { .. })`, as \
             `#[async_trait]` writes them), to hold the lock around: write `async fn`"
        } else {
            "#[distributed_lock] needs an `async fn`: write `async fn` (the lock is taken and \
             released with async Redis calls)"
        };
        return Err(syn::Error::new(sig.fn_token.span(), message));
    }
    let sig = boxed.as_ref().map_or(sig, |boxed| &boxed.written);
    check_return_type(&sig.output)?;
    let key = parse_key(&args.key, sig)?;

    let span = args.key.span();
    let krate = krate_at(&args, span);
    let format = &key.format;
    let key_args = &key.args;
    let name_arg = if key_args.is_empty() {
        let literal = &args.key;
        quote!(#literal)
    } else {
        quote_spanned!(span=> ::std::format!(#format #(, #key_args)*))
    };
    // The builder: a `Lock`, or an `RwLock` or `Semaphore` (same builder
    // methods) whose side or permit is taken after the chain, or for
    // `key = [..]` the set of every name (`Lock::all`, same methods).
    let set = set_of_names(&args, sig)?;
    let mut lock = match args.kind {
        _ if !args.keys.is_empty() => quote_spanned!(span=> #krate::Lock::all(#set)),
        LockKind::Exclusive => quote_spanned!(span=> #krate::Lock::new(#name_arg)),
        LockKind::Read | LockKind::Write => {
            quote_spanned!(span=> #krate::RwLock::new(#name_arg))
        }
        LockKind::Semaphore(permits) => {
            quote_spanned!(span=> #krate::Semaphore::new(#name_arg, #permits))
        }
    };
    if let Some(client) = &args.client {
        // Borrowed, then cloned: the expression's owner (`app` in
        // `app.locks`) stays usable in the body. A type that is not a client
        // is an error at the expression.
        // `&` at the expression's first token, the parentheses at its last:
        // an error about the argument then underlines the whole expression.
        let tokens: Vec<_> = quote!(#client).into_iter().collect();
        let first = tokens
            .first()
            .map_or_else(Span::call_site, |token| token.span());
        let last = tokens.last().map_or(first, |token| token.span());
        let mut parenthesized =
            proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, quote!(#client));
        parenthesized.set_span(last);
        let krate = krate_at(&args, first);
        // A type that is not a client is an error naming the type and the
        // trait `attribute::LockClient`, which says what to write (reached
        // through `__private`, as `run` is, so that a wrong `crate =` path is
        // one error at each place, not one per name).
        let client = quote_spanned!(first=>
            #krate::__private::LockClient::lock_client(&#parenthesized)
        );
        lock = quote!(#lock.client(#client));
    }
    if let Some(ttl) = args.ttl_ms {
        lock = quote!(#lock.ttl(::core::time::Duration::from_millis(#ttl)));
    }
    if let Some(wait) = args.wait_ms {
        lock = quote!(#lock.wait(::core::time::Duration::from_millis(#wait)));
    }
    if args.renew {
        lock = quote!(#lock.renew());
    }
    if let Some(max_hold) = args.max_hold_ms {
        lock = quote!(#lock.max_hold(::core::time::Duration::from_millis(#max_hold)));
    }
    if args.continue_on_lost {
        let krate = krate_at(&args, Span::call_site());
        lock = quote!(#lock.on_lost(#krate::OnLost::Continue));
    }
    if args.fair {
        lock = quote!(#lock.fair());
    }
    if args.fencing {
        lock = quote!(#lock.fencing());
    }
    if let Some(hold_at_least) = args.hold_at_least_ms {
        lock = quote!(#lock.hold_at_least(::core::time::Duration::from_millis(#hold_at_least)));
    }
    match args.kind {
        LockKind::Exclusive => {}
        LockKind::Read => lock = quote!(#lock.read()),
        LockKind::Write => lock = quote!(#lock.write()),
        LockKind::Semaphore(_) => lock = quote!(#lock.take(1)),
    }
    let name = sig.ident.to_string();
    // The key as written: the `lock` label of the metrics (never a
    // rendered id); a set's templates, joined.
    let template = if args.keys.is_empty() {
        args.key.clone()
    } else {
        let joined: Vec<String> = args.keys.iter().map(LitStr::value).collect();
        LitStr::new(&joined.join(", "), span)
    };
    // One runtime function for a single lock, one for a set.
    let runner = if args.keys.is_empty() {
        quote!(run)
    } else {
        quote!(run_all)
    };
    // The return type is checked once, where `not_acquired` is named, at the
    // return type as written: a type the runtime cannot use is one error
    // there, naming the type (and, for `Result<T, E>`, the `E` without
    // `From<LockError>`). `run` itself has no bound, so that nothing else
    // repeats the error.
    let (run, not_acquired) = match &sig.output {
        syn::ReturnType::Type(_, ty) => {
            let span = ty.span();
            let krate = krate_at(&args, span);
            // `impl Trait` cannot be named: inferred from the body.
            let named = if mentions_impl_trait(ty) {
                quote_spanned!(span=> _)
            } else {
                quote!(#ty)
            };
            (
                quote_spanned!(span=> #krate::__private::#runner::<#named>),
                quote_spanned!(span=> <#named as #krate::__private::NotAcquired>::not_acquired),
            )
        }
        syn::ReturnType::Default => {
            let krate = krate_at(&args, Span::call_site());
            (
                quote!(#krate::__private::#runner::<()>),
                quote!(<() as #krate::__private::NotAcquired>::not_acquired),
            )
        }
    };
    // syn puts the body's inner attributes (`#![allow(..)]`) with the outer
    // ones; they go back inside the body.
    let (inner, outer): (Vec<_>, Vec<_>) = attrs
        .iter()
        .partition(|attr| matches!(attr.style, syn::AttrStyle::Inner(_)));
    let caller = quote!(::core::concat!(::core::module_path!(), "::", #name));
    let Some(boxed) = boxed else {
        let sig = &function.sig;
        return Ok(quote! {
            #(#outer)*
            #vis #sig {
                #(#inner)*
                #run(
                    #lock,
                    #caller,
                    #template,
                    async move #block,
                    #not_acquired,
                )
                .await
            }
        });
    };
    // The function as it came, its future now the body of one that holds
    // the lock. The lock is built in that outer future from the parameters
    // (the names of destructured ones borrowed back from `__argN`), before
    // the inner future takes them.
    let original = &function.sig;
    let boxed_future::BoxedFuture {
        before,
        pin,
        future,
        bindings,
        ..
    } = boxed;
    let capture = &future.capture;
    if !bindings.is_empty() {
        lock = quote!({ #(#bindings)* #lock });
    }
    let held = quote! {
        async #capture {
            #run(#lock, #caller, #template, #future, #not_acquired).await
        }
    };
    let last = match pin {
        Some(pin) => quote!(#pin(#held)),
        None => held,
    };
    Ok(quote! {
        #(#outer)*
        #vis #original {
            #(#inner)*
            #(#before)*
            #last
        }
    })
}

/// `key = ["a:<x>", "b:<y>"]`: an array of the names, each template checked
/// and rendered as a single key is (`String`s, so that literal and rendered
/// names mix). Empty tokens for a single key.
fn set_of_names(args: &LockArgs, sig: &syn::Signature) -> syn::Result<TokenStream> {
    if args.keys.is_empty() {
        return Ok(TokenStream::new());
    }
    let mut names = Vec::with_capacity(args.keys.len());
    for literal in &args.keys {
        let key = parse_key(literal, sig)?;
        let span = literal.span();
        let (format, key_args) = (&key.format, &key.args);
        names.push(if key_args.is_empty() {
            quote_spanned!(span=> ::std::string::String::from(#literal))
        } else {
            quote_spanned!(span=> ::std::format!(#format #(, #key_args)*))
        });
    }
    Ok(quote!([#(#names),*]))
}

/// The path of `lock_runtime` (`crate = "path"`, else `::lock_runtime`), its
/// tokens spanned at `span` so that an error in what follows points where the
/// rest of the path does.
fn krate_at(args: &LockArgs, span: Span) -> TokenStream {
    match &args.krate {
        Some(path) => quote!(#path)
            .into_iter()
            .map(|mut token| {
                token.set_span(span);
                token
            })
            .collect(),
        None => quote_spanned!(span=> ::lock_runtime),
    }
}

/// `impl Trait` cannot be named in a turbofish.
fn mentions_impl_trait(ty: &syn::Type) -> bool {
    fn walk(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|token| match token {
            proc_macro2::TokenTree::Ident(ident) => ident == "impl",
            proc_macro2::TokenTree::Group(group) => walk(group.stream()),
            _ => false,
        })
    }
    walk(quote!(#ty))
}

#[cfg(test)]
mod tests {
    use quote::quote;

    fn pretty(tokens: proc_macro2::TokenStream) -> String {
        prettyplease::unparse(&syn::parse2(tokens).expect("the expansion is a valid file"))
    }

    #[test]
    fn lottery_expansion() {
        let expanded = super::expand(
            quote!(key = "lottery:<date>", ttl = "10s"),
            quote! {
                pub async fn draw_lottery(date: NaiveDate) -> Result<Vec<UserId>, JobError> {
                    let users = load_users(date).await?;
                    Ok(pick_winners(&users, 10))
                }
            },
        );
        insta::assert_snapshot!(pretty(expanded));
    }

    #[test]
    fn several_keys_at_once() {
        let expanded = super::expand(
            quote!(
                key = ["account:<from>", "account:<to>", "ledger"],
                ttl = "10s",
                wait = "2s",
                renew,
                fencing
            ),
            quote! {
                async fn transfer(from: u64, to: u64, cents: i64) -> Result<(), BankError> {
                    move_money(from, to, cents).await
                }
            },
        );
        insta::assert_snapshot!(pretty(expanded));
    }

    #[test]
    fn renewed_with_max_hold() {
        let expanded = super::expand(
            quote!(key = "report:<day>", ttl = "10s", renew, max_hold = "10m"),
            quote! {
                async fn build_report(day: u32) {
                    render(day).await;
                }
            },
        );
        insta::assert_snapshot!(pretty(expanded));
    }

    #[test]
    fn method_with_field_path_wait_fair_and_fencing() {
        let expanded = super::expand(
            quote!(
                key = "order:<self.shard>:<order.id>",
                wait = "2s",
                fair,
                fencing
            ),
            quote! {
                async fn settle(&self, order: &Order) -> Option<Receipt> {
                    self.charge(order).await
                }
            },
        );
        insta::assert_snapshot!(pretty(expanded));
    }

    #[test]
    fn axum_handler_with_destructured_extractors_and_client() {
        let expanded = super::expand(
            quote!(
                key = "order:<id>:<req.currency>",
                ttl = "10s",
                wait = "2s",
                client = app.locks
            ),
            quote! {
                async fn settle(
                    State(app): State<App>,
                    Path(id): Path<u64>,
                    Json(req): Json<SettleRequest>,
                ) -> Result<Json<Receipt>, ApiError> {
                    let receipt = app.payments.settle(id, req).await?;
                    Ok(Json(receipt))
                }
            },
        );
        insta::assert_snapshot!(pretty(expanded));
    }

    #[test]
    fn crate_path_and_client_method() {
        let expanded = super::expand(
            quote!(
                key = "shard:<self.shard>",
                renew,
                on_lost = "continue",
                client = self.locks,
                crate = "my_service::locks"
            ),
            quote! {
                async fn rebalance(&self) {
                    self.move_keys().await;
                }
            },
        );
        insta::assert_snapshot!(pretty(expanded));
    }

    #[test]
    fn read_side_with_wait_renew_and_fencing() {
        let expanded = super::expand(
            quote!(key = "prices:<market>", read, wait = "2s", renew, fencing),
            quote! {
                async fn quote_price(market: &str) -> Result<u64, PriceError> {
                    load_price(market).await
                }
            },
        );
        insta::assert_snapshot!(pretty(expanded));
    }

    #[test]
    fn semaphore_with_permits_and_client() {
        let expanded = super::expand(
            quote!(
                key = "exports",
                permits = 4,
                ttl = "30s",
                fair,
                client = app.locks
            ),
            quote! {
                async fn export(app: &App) -> Option<usize> {
                    app.run_export().await
                }
            },
        );
        insta::assert_snapshot!(pretty(expanded));
    }

    /// What `#[async_trait]` made of `async fn settle(&self, (shop, id): (u32,
    /// u64)) -> Result<Receipt, Status>` before this attribute ran: the lock
    /// is held around the future it returns, built from the parameters as
    /// written (`self`, and the destructured names borrowed back).
    #[test]
    fn under_async_trait() {
        let expanded = super::expand(
            quote!(
                key = "order:<self.shard>:<shop>:<id>",
                wait = "2s",
                client = self.locks
            ),
            quote! {
                #[allow(clippy::type_complexity)]
                fn settle<'life0, 'async_trait>(
                    &'life0 self,
                    __arg1: (u32, u64),
                ) -> ::core::pin::Pin<
                    Box<
                        dyn ::core::future::Future<Output = Result<Receipt, Status>>
                            + ::core::marker::Send
                            + 'async_trait,
                    >,
                >
                where
                    'life0: 'async_trait,
                    Self: 'async_trait,
                {
                    Box::pin(async move {
                        if let ::core::option::Option::Some(__ret) =
                            ::core::option::Option::None::<Result<Receipt, Status>>
                        {
                            #[allow(unreachable_code)]
                            return __ret;
                        }
                        let __self = self;
                        let (shop, id) = {
                            let __arg1 = __arg1;
                            __arg1
                        };
                        let __ret: Result<Receipt, Status> = { __self.charge(shop, id).await };
                        #[allow(unreachable_code)]
                        __ret
                    })
                }
            },
        );
        insta::assert_snapshot!(pretty(expanded));
    }

    /// `write` builds the same chain on an `RwLock`, ending with `.write()`.
    #[test]
    fn write_side_builds_on_an_rw_lock() {
        let expanded = super::expand(
            quote!(key = "doc:<id>", write, ttl = "5s", hold_at_least = "1s"),
            quote!(
                async fn edit(id: u64) {}
            ),
        )
        .to_string();
        assert!(!expanded.contains("compile_error"), "{expanded}");
        assert!(
            expanded.contains(
                ":: lock_runtime :: RwLock :: new (:: std :: format ! (\"doc:{}\" , id)) . ttl"
            ),
            "{expanded}"
        );
        assert!(
            expanded.contains(
                ". hold_at_least (:: core :: time :: Duration :: from_millis (1000u64)) . write ()"
            ),
            "{expanded}"
        );
    }

    /// With `crate = "..."`, nothing in the expansion names `lock_runtime`.
    #[test]
    fn crate_path_replaces_every_lock_runtime_path() {
        for output in [
            quote!(),
            quote!(-> Option<u8>),
            quote!(-> Option<impl Sized>),
        ] {
            let expanded = super::expand(
                quote!(
                    key = "job:<n>",
                    renew,
                    on_lost = "continue",
                    client = locks,
                    crate = "crate::locks"
                ),
                quote!(
                    async fn job(n: u8, locks: &Client) #output { todo!() }
                ),
            )
            .to_string();
            assert!(!expanded.contains("compile_error"), "{expanded}");
            assert!(!expanded.contains("lock_runtime"), "{expanded}");
            assert!(
                expanded.contains("crate :: locks :: __private :: run"),
                "{expanded}"
            );
            assert!(
                expanded.contains("crate :: locks :: __private :: LockClient :: lock_client"),
                "{expanded}"
            );
            assert!(
                expanded.contains("crate :: locks :: __private :: NotAcquired"),
                "{expanded}"
            );
            assert!(
                expanded.contains("crate :: locks :: OnLost :: Continue"),
                "{expanded}"
            );
            assert!(
                expanded.contains("crate :: locks :: Lock :: new"),
                "{expanded}"
            );
        }
    }

    #[test]
    fn durations_up_to_a_year_expand() {
        let expanded = super::expand(
            quote!(
                key = "job",
                ttl = "8760h",
                wait = "1h30m",
                renew,
                max_hold = "8760h",
                hold_at_least = "1h30m"
            ),
            quote!(
                async fn job() {}
            ),
        )
        .to_string();
        assert!(!expanded.contains("compile_error"), "{expanded}");
        assert!(expanded.contains("31536000000u64"), "{expanded}");
        assert!(expanded.contains("5400000u64"), "{expanded}");
    }
}

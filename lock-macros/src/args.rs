//! Parsing the attribute's arguments: `key = "...", ttl = "...", wait = "..."`,
//! `read`, `write`, `permits = N`, `client = <expr>`, `crate = "path"`.

use proc_macro2::{Span, TokenStream};
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::LitStr;

use crate::duration::{check_at_most_a_year, check_renewed_ttl, parse_duration};
use crate::suggest;

const ARGUMENTS: &str = "`key`, `ttl`, `wait`, `renew`, `max_hold`, `on_lost`, `fair`, \
                         `fencing`, `hold_at_least`, `read`, `write`, `permits`, `client` or \
                         `crate`";

/// Every argument's name, for "did you mean".
const ARGUMENT_NAMES: &[&str] = &[
    "key",
    "ttl",
    "wait",
    "renew",
    "max_hold",
    "on_lost",
    "fair",
    "fencing",
    "hold_at_least",
    "read",
    "write",
    "permits",
    "client",
    "crate",
];

/// What the function's body runs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockKind {
    /// No `read`, `write` or `permits`: an exclusive `Lock`.
    Exclusive,
    /// `read`: the read side of an `RwLock`.
    Read,
    /// `write`: the write side of an `RwLock`.
    Write,
    /// `permits = N`: one permit of a `Semaphore` of N permits.
    Semaphore(u32),
}

/// The checked arguments.
pub(crate) struct LockArgs {
    /// The key template, or the first of a list.
    pub(crate) key: LitStr,
    /// `key = ["a:<x>", "b:<y>"]`: every template of the list (several
    /// locks at once, `Lock::all`); empty for a single `key = "..."`.
    pub(crate) keys: Vec<LitStr>,
    pub(crate) ttl_ms: Option<u64>,
    pub(crate) wait_ms: Option<u64>,
    pub(crate) renew: bool,
    pub(crate) max_hold_ms: Option<u64>,
    /// `on_lost = "continue"`; `"stop"` is the default and emits nothing.
    pub(crate) continue_on_lost: bool,
    pub(crate) fair: bool,
    pub(crate) fencing: bool,
    pub(crate) hold_at_least_ms: Option<u64>,
    /// `client = <expr>`: the lock client, evaluated in the function's scope.
    pub(crate) client: Option<syn::Expr>,
    /// `crate = "path"`: where `lock_runtime` is reachable; `::lock_runtime`
    /// when not given.
    pub(crate) krate: Option<syn::Path>,
    pub(crate) kind: LockKind,
}

/// Where a whole argument (`hold_at_least = "30s"`, `fencing`) is written:
/// its first and last tokens, for an error underlining all of it.
#[derive(Clone, Copy)]
struct ArgumentSpan {
    first: Span,
    last: Span,
}

impl ArgumentSpan {
    fn flag(span: Span) -> Self {
        ArgumentSpan {
            first: span,
            last: span,
        }
    }

    fn error(self, message: String) -> syn::Error {
        // `new_spanned` spans an error from the first token to the last.
        let tokens: TokenStream = [
            proc_macro2::Ident::new("first", self.first),
            proc_macro2::Ident::new("last", self.last),
        ]
        .into_iter()
        .map(proc_macro2::TokenTree::from)
        .collect();
        syn::Error::new_spanned(tokens, message)
    }
}

#[derive(Default)]
pub(crate) struct ArgsParser {
    /// The template(s), and whether they were written as a list.
    key: Option<(Vec<LitStr>, bool)>,
    /// With its literal, for the check against `renew` in `finish`.
    ttl_ms: Option<(u64, LitStr)>,
    wait_ms: Option<u64>,
    renew: Option<Span>,
    max_hold_ms: Option<(u64, Span)>,
    on_lost: Option<(bool, Span)>,
    fair: Option<Span>,
    fencing: Option<Span>,
    hold_at_least_ms: Option<(u64, ArgumentSpan)>,
    client: Option<syn::Expr>,
    krate: Option<syn::Path>,
    read: Option<Span>,
    write: Option<Span>,
    permits: Option<u32>,
    /// Where `permits` is written.
    permits_span: Option<Span>,
}

impl ArgsParser {
    pub(crate) fn parse(&mut self, meta: ParseNestedMeta) -> syn::Result<()> {
        let Some(name) = meta.path.get_ident().map(|ident| ident.to_string()) else {
            return Err(meta.error(format!("unknown argument: expected {ARGUMENTS}")));
        };
        match name.as_str() {
            "key" => {
                let keys = key_value(&meta)?;
                set_once(&meta, &name, &mut self.key, keys)
            }
            "ttl" => {
                let literal = string_value(&meta, &name, "\"10s\"")?;
                let millis = parse_duration(&name, &literal)?;
                check_at_most_a_year(
                    &name,
                    &literal,
                    millis,
                    "; to hold the lock for longer than its ttl, add `renew`",
                )?;
                set_once(&meta, &name, &mut self.ttl_ms, (millis, literal))
            }
            "wait" => {
                let literal = string_value(&meta, &name, "\"5s\"")?;
                let millis = parse_duration(&name, &literal)?;
                set_once(&meta, &name, &mut self.wait_ms, millis)
            }
            "renew" => {
                let span = flag(&meta, &name)?;
                set_once(&meta, &name, &mut self.renew, span)
            }
            "fair" => {
                let span = flag(&meta, &name)?;
                set_once(&meta, &name, &mut self.fair, span)
            }
            "fencing" => {
                let span = flag(&meta, &name)?;
                set_once(&meta, &name, &mut self.fencing, span)
            }
            "hold_at_least" => {
                let literal = string_value(&meta, &name, "\"30s\"")?;
                let millis = parse_duration(&name, &literal)?;
                check_at_most_a_year(&name, &literal, millis, "")?;
                let span = ArgumentSpan {
                    first: meta.path.span(),
                    last: literal.span(),
                };
                set_once(&meta, &name, &mut self.hold_at_least_ms, (millis, span))
            }
            "read" => {
                let span = flag(&meta, &name)?;
                set_once(&meta, &name, &mut self.read, span)?;
                self.check_one_kind(&meta, &name)
            }
            "write" => {
                let span = flag(&meta, &name)?;
                set_once(&meta, &name, &mut self.write, span)?;
                self.check_one_kind(&meta, &name)
            }
            "permits" => {
                let permits = permits_value(&meta)?;
                set_once(&meta, &name, &mut self.permits, permits)?;
                self.permits_span = Some(meta.path.span());
                self.check_one_kind(&meta, &name)
            }
            "max_hold" => {
                let literal = string_value(&meta, &name, "\"10m\"")?;
                let millis = parse_duration(&name, &literal)?;
                check_at_most_a_year(
                    &name,
                    &literal,
                    millis,
                    ", or leave `max_hold` out to renew for as long as the body runs",
                )?;
                set_once(
                    &meta,
                    &name,
                    &mut self.max_hold_ms,
                    (millis, literal.span()),
                )
            }
            "client" => {
                let expr = client_value(&meta)?;
                set_once(&meta, &name, &mut self.client, expr)
            }
            "crate" => {
                let literal = string_value(&meta, &name, "\"my_service::locks\"")?;
                let path = crate_path(&literal)?;
                set_once(&meta, &name, &mut self.krate, path)
            }
            "on_lost" => {
                let literal = string_value(&meta, &name, "\"continue\"")?;
                let continue_on_lost = match literal.value().as_str() {
                    "stop" => false,
                    "continue" => true,
                    other => {
                        return Err(syn::Error::new(
                            literal.span(),
                            format!(
                                "unknown `on_lost` value \"{other}\": write \"stop\" (the default: \
                                 the body is stopped when the lock is lost) or \"continue\""
                            ),
                        ))
                    }
                };
                set_once(
                    &meta,
                    &name,
                    &mut self.on_lost,
                    (continue_on_lost, literal.span()),
                )
            }
            other => Err(meta.error(unknown_argument(other))),
        }
    }

    /// After `read`, `write` or `permits` (`name`) was set: none of the
    /// other two may be set too. The error points at the later argument.
    fn check_one_kind(&self, meta: &ParseNestedMeta, name: &str) -> syn::Result<()> {
        let given = [
            ("read", self.read.is_some()),
            ("write", self.write.is_some()),
            ("permits", self.permits.is_some()),
        ];
        let Some((other, _)) = given.iter().find(|(other, given)| *given && *other != name) else {
            return Ok(());
        };
        let message = match (name, *other) {
            ("read", "write") | ("write", "read") => format!(
                "`{name}` cannot be combined with `{other}`: the function takes the read/write \
                 lock either for reading (`read`, shared with other readers) or for writing \
                 (`write`, alone); keep one of them"
            ),
            ("permits", rw) => format!(
                "`permits` cannot be combined with `{rw}`: `permits = N` makes the lock a \
                 semaphore of N permits, `{rw}` a read/write lock taken for {}; keep one of them",
                reading_or_writing(rw)
            ),
            (rw, _) => format!(
                "`{rw}` cannot be combined with `permits`: `{rw}` makes the lock a read/write \
                 lock taken for {}, `permits = N` a semaphore of N permits; keep one of them",
                reading_or_writing(rw)
            ),
        };
        Err(meta.error(message))
    }

    pub(crate) fn finish(self) -> syn::Result<LockArgs> {
        let Some((mut keys, list)) = self.key else {
            return Err(syn::Error::new(
                Span::call_site(),
                "missing `key`: name the lock, e.g. #[distributed_lock(key = \"order:<order_id>\")]",
            ));
        };
        let key = keys[0].clone();
        if !list {
            keys.clear();
        } else if let Some(span) = self.read.or(self.write).or(self.permits_span) {
            return Err(syn::Error::new(
                span,
                "`key = [..]` takes several exclusive locks at once: `read`, `write` and \
                 `permits` do not apply to a set; remove them, or name one key",
            ));
        }
        if self.renew.is_none() {
            let needs_renew = [
                ("max_hold", self.max_hold_ms.map(|(_, span)| span)),
                ("on_lost", self.on_lost.map(|(_, span)| span)),
            ];
            for (name, span) in needs_renew {
                if let Some(span) = span {
                    return Err(syn::Error::new(
                        span,
                        format!("`{name}` only applies to a renewed lock: add `renew`"),
                    ));
                }
            }
        }
        if self.permits.is_some() {
            // A semaphore has several holders at once.
            let fencing = self
                .fencing
                .map(|span| ("fencing", ArgumentSpan::flag(span)));
            let hold_at_least = self
                .hold_at_least_ms
                .map(|(_, span)| ("hold_at_least", span));
            if let Some((name, span)) = fencing.or(hold_at_least) {
                let why = if name == "fencing" {
                    "a fencing token orders holders one after another, and a semaphore has \
                     several holders at once"
                } else {
                    "a semaphore has several holders at once, and a permit kept after the body \
                     would only keep the next caller out"
                };
                return Err(span.error(format!(
                    "`{name}` does not apply to a semaphore (`permits = N`): {why}; remove \
                     `{name}`, or remove `permits` for an exclusive lock"
                )));
            }
        }
        if let (Some(_), Some((_, span))) = (self.read, self.hold_at_least_ms) {
            return Err(span.error(
                "`hold_at_least` does not apply to `read`: a read share kept after the body \
                 would hold writers off; remove `hold_at_least` (only an exclusive lock or \
                 `write` takes it)"
                    .to_owned(),
            ));
        }
        // The default ttl (30 s) is long enough for `renew`: only an explicit
        // ttl can be too short.
        if let (Some(_), Some((millis, literal))) = (self.renew, &self.ttl_ms) {
            check_renewed_ttl(literal, *millis)?;
        }
        Ok(LockArgs {
            key,
            keys,
            ttl_ms: self.ttl_ms.map(|(millis, _)| millis),
            wait_ms: self.wait_ms,
            renew: self.renew.is_some(),
            max_hold_ms: self.max_hold_ms.map(|(millis, _)| millis),
            continue_on_lost: self
                .on_lost
                .is_some_and(|(continue_on_lost, _)| continue_on_lost),
            fair: self.fair.is_some(),
            fencing: self.fencing.is_some(),
            hold_at_least_ms: self.hold_at_least_ms.map(|(millis, _)| millis),
            client: self.client,
            krate: self.krate,
            kind: match (self.read, self.write, self.permits) {
                (_, _, Some(permits)) => LockKind::Semaphore(permits),
                (Some(_), _, _) => LockKind::Read,
                (_, Some(_), _) => LockKind::Write,
                _ => LockKind::Exclusive,
            },
        })
    }
}

/// What an unknown argument's error says: what was meant, when a known
/// argument is one typo away, else every argument.
fn unknown_argument(written: &str) -> String {
    match suggest::closest(written, ARGUMENT_NAMES) {
        Some(meant) => format!("unknown argument `{written}`: did you mean `{meant}`?"),
        None => format!("unknown argument `{written}`: expected {ARGUMENTS}"),
    }
}

fn reading_or_writing(side: &str) -> &'static str {
    if side == "read" {
        "reading"
    } else {
        "writing"
    }
}

/// `permits = N`: an integer literal from 1 to `u32::MAX`, unsuffixed or
/// `u32`.
fn permits_value(meta: &ParseNestedMeta) -> syn::Result<u32> {
    const RANGE: &str = "from 1 to 4294967295 (u32::MAX)";
    let value = meta.value().map_err(|_| {
        meta.error(
            "`permits` needs a value, the number of callers let in at once (from 1 to \
             4294967295): write `permits = 4`",
        )
    })?;
    let expr: syn::Expr = value.parse()?;
    let literal = match expr {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(literal),
            ..
        }) => literal,
        other => {
            return Err(syn::Error::new_spanned(
                other,
                format!(
                    "`permits` takes an integer literal {RANGE}: write `permits = 4` (the \
                     attribute reads the number itself, so a string, a constant or an expression \
                     cannot be used)"
                ),
            ))
        }
    };
    if !matches!(literal.suffix(), "" | "u32") {
        return Err(syn::Error::new(
            literal.span(),
            format!(
                "`permits` is a `u32`: write `permits = {}` without the `{}` suffix",
                literal.base10_digits(),
                literal.suffix()
            ),
        ));
    }
    match literal.base10_parse::<u32>() {
        Ok(0) => Err(syn::Error::new(
            literal.span(),
            "`permits = 0` would let nobody in: a semaphore needs at least 1 permit; write \
             `permits = 1` or more",
        )),
        Ok(permits) => Ok(permits),
        Err(_) => Err(syn::Error::new(
            literal.span(),
            format!(
                "`permits` of {} is over the limit of {} (u32::MAX); write `permits = {}` or less",
                literal.base10_digits(),
                u32::MAX,
                u32::MAX
            ),
        )),
    }
}

/// A flag such as `renew`: no value allowed. Returns its span.
fn flag(meta: &ParseNestedMeta, name: &str) -> syn::Result<Span> {
    if !(meta.input.is_empty() || meta.input.peek(syn::Token![,])) {
        return Err(meta.error(format!(
            "`{name}` is a flag and takes no value: write `{name}`"
        )));
    }
    Ok(meta.path.span())
}

/// `key = "..."`, or `key = ["...", "..."]` (several locks at once): the
/// templates, and whether they were a list.
fn key_value(meta: &ParseNestedMeta) -> syn::Result<(Vec<LitStr>, bool)> {
    const EXAMPLE: &str = "`key = \"order:<order_id>\"`, or for several locks at once \
                           `key = [\"account:<from>\", \"account:<to>\"]`";
    let value = meta
        .value()
        .map_err(|_| meta.error(format!("`key` needs a value: write {EXAMPLE}")))?;
    let expr: syn::Expr = value.parse()?;
    match expr {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(literal),
            ..
        }) => Ok((vec![literal], false)),
        syn::Expr::Array(array) => {
            if array.elems.is_empty() {
                return Err(syn::Error::new_spanned(
                    array,
                    "`key = []` names no lock: give at least one template, e.g. \
                     `key = [\"account:<from>\", \"account:<to>\"]`",
                ));
            }
            let mut keys = Vec::with_capacity(array.elems.len());
            for element in array.elems {
                match element {
                    syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(literal),
                        ..
                    }) => keys.push(literal),
                    other => {
                        return Err(syn::Error::new_spanned(
                            other,
                            "each key of `key = [..]` is a string literal template: write \
                             `key = [\"account:<from>\", \"account:<to>\"]`",
                        ))
                    }
                }
            }
            Ok((keys, true))
        }
        other => Err(syn::Error::new_spanned(
            other,
            format!("`key` takes a string literal: write {EXAMPLE}"),
        )),
    }
}

fn string_value(meta: &ParseNestedMeta, name: &str, example: &str) -> syn::Result<LitStr> {
    let value = meta.value().map_err(|_| {
        meta.error(format!(
            "`{name}` needs a value: write `{name} = {example}`"
        ))
    })?;
    let expr: syn::Expr = value.parse()?;
    match expr {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(literal),
            ..
        }) => Ok(literal),
        other => Err(syn::Error::new_spanned(
            other,
            format!("`{name}` takes a string literal: write `{name} = {example}`"),
        )),
    }
}

/// `client = <expr>`: any expression but a string literal (a URL there would
/// suggest the attribute connects; it only names a client built elsewhere).
fn client_value(meta: &ParseNestedMeta) -> syn::Result<syn::Expr> {
    const EXAMPLE: &str = "`client = app.locks` or `client = &state.client`";
    let value = meta.value().map_err(|_| {
        meta.error(format!(
            "`client` needs a value: write an expression for the `lock_runtime::Client` to use, \
             e.g. {EXAMPLE}"
        ))
    })?;
    let expr: syn::Expr = value.parse()?;
    if let syn::Expr::Lit(syn::ExprLit {
        lit: syn::Lit::Str(literal),
        ..
    }) = &expr
    {
        return Err(syn::Error::new(
            literal.span(),
            format!(
                "`client` takes an expression, not a string: write an expression for the \
                 `lock_runtime::Client` to use (a `Client`, `&Client` or `Arc<Client>`, e.g. \
                 {EXAMPLE}); to lock on another Redis, build a `Client::new(Config::new(url))` \
                 and name it here"
            ),
        ));
    }
    Ok(expr)
}

/// `crate = "my_service::locks"`: a module path, no generics, nothing after.
fn crate_path(literal: &LitStr) -> syn::Result<syn::Path> {
    literal.parse_with(syn::Path::parse_mod_style).map_err(|_| {
        syn::Error::new(
            literal.span(),
            format!(
                "invalid `crate` path \"{}\": write the path `lock_runtime` is reachable at, \
                 e.g. `crate = \"my_service::locks\"` or `crate = \"::lock_runtime\"`",
                literal.value()
            ),
        )
    })
}

fn set_once<T>(
    meta: &ParseNestedMeta,
    name: &str,
    slot: &mut Option<T>,
    value: T,
) -> syn::Result<()> {
    if slot.is_some() {
        return Err(meta.error(format!("`{name}` is given twice: keep one")));
    }
    *slot = Some(value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use proc_macro2::TokenStream;
    use quote::quote;
    use syn::parse::Parser;

    use super::{ArgsParser, LockArgs, LockKind};

    fn parse(args: TokenStream) -> syn::Result<LockArgs> {
        let mut parser = ArgsParser::default();
        syn::meta::parser(|meta| parser.parse(meta)).parse2(args)?;
        parser.finish()
    }

    fn error(args: TokenStream) -> String {
        match parse(args.clone()) {
            Ok(_) => panic!("`{args}` was accepted"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn durations_up_to_a_year_are_accepted() {
        let args = parse(quote!(key = "job", ttl = "1h30m", wait = "2s")).unwrap();
        assert_eq!(args.ttl_ms, Some(5_400_000));
        assert_eq!(args.wait_ms, Some(2_000));

        let args = parse(quote!(
            key = "job",
            ttl = "8760h",
            renew,
            max_hold = "8760h",
            hold_at_least = "525600m"
        ))
        .unwrap();
        assert_eq!(args.ttl_ms, Some(31_536_000_000));
        assert_eq!(args.max_hold_ms, Some(31_536_000_000));
        assert_eq!(args.hold_at_least_ms, Some(31_536_000_000));
        assert!(args.renew);

        // `wait` has no upper limit.
        let args = parse(quote!(key = "job", wait = "9000h")).unwrap();
        assert_eq!(args.wait_ms, Some(32_400_000_000));
    }

    #[test]
    fn durations_over_a_year_are_rejected() {
        assert_eq!(
            error(quote!(key = "job", ttl = "9000h")),
            "`ttl` of 9000h is over the limit of one year (8760h); write `ttl = \"8760h\"` or \
             less; to hold the lock for longer than its ttl, add `renew`"
        );
        assert_eq!(
            error(quote!(
                key = "job",
                ttl = "10s",
                renew,
                max_hold = "8760h1ms"
            )),
            "`max_hold` of 8760h1ms is over the limit of one year (8760h); write `max_hold = \
             \"8760h\"` or less, or leave `max_hold` out to renew for as long as the body runs"
        );
        assert_eq!(
            error(quote!(key = "job", hold_at_least = "600000m")),
            "`hold_at_least` of 600000m is over the limit of one year (8760h); write \
             `hold_at_least = \"8760h\"` or less"
        );
    }

    #[test]
    fn client_takes_an_expression() {
        for expr in [
            quote!(app.locks),
            quote!(self.locks),
            quote!(&state.client),
            quote!(locks.clone()),
            quote!(LOCKS.get().unwrap()),
            quote!(clients[0]),
        ] {
            let args = parse(quote!(key = "job", client = #expr, ttl = "1s")).unwrap();
            let client = args.client.expect("the client is kept");
            assert_eq!(quote!(#client).to_string(), expr.to_string());
            assert_eq!(args.ttl_ms, Some(1_000));
        }
        assert!(parse(quote!(key = "job")).unwrap().client.is_none());

        assert_eq!(
            error(quote!(key = "job", client = "redis://127.0.0.1/")),
            "`client` takes an expression, not a string: write an expression for the \
             `lock_runtime::Client` to use (a `Client`, `&Client` or `Arc<Client>`, e.g. \
             `client = app.locks` or `client = &state.client`); to lock on another Redis, build \
             a `Client::new(Config::new(url))` and name it here"
        );
        assert_eq!(
            error(quote!(key = "job", client)),
            "`client` needs a value: write an expression for the `lock_runtime::Client` to \
             use, e.g. `client = app.locks` or `client = &state.client`"
        );
        assert_eq!(
            error(quote!(key = "job", client = a.locks, client = b.locks)),
            "`client` is given twice: keep one"
        );
    }

    #[test]
    fn crate_takes_a_module_path() {
        for path in [
            "my_service::locks",
            "crate::locks",
            "::lock_runtime",
            "lock_runtime",
            "self::r#async::locks",
            " spaced :: path ",
        ] {
            let args = parse(quote!(key = "job", crate = #path)).unwrap();
            let parsed = args.krate.expect("the path is kept");
            let expected: syn::Path = syn::parse_str(path).unwrap();
            assert_eq!(quote!(#parsed).to_string(), quote!(#expected).to_string());
        }
        for path in [
            "",
            "my service",
            "locks::",
            "a::<T>",
            "a<T>",
            "\"x\"",
            "a::b;",
        ] {
            assert_eq!(
                error(quote!(key = "job", crate = #path)),
                format!(
                    "invalid `crate` path \"{path}\": write the path `lock_runtime` is \
                     reachable at, e.g. `crate = \"my_service::locks\"` or `crate = \
                     \"::lock_runtime\"`"
                ),
                "for {path:?}"
            );
        }
        assert_eq!(
            error(quote!(key = "job", crate = my_service::locks)),
            "`crate` takes a string literal: write `crate = \"my_service::locks\"`"
        );
    }

    #[test]
    fn a_renewed_lock_needs_a_ttl_of_at_least_10ms() {
        let message = "`ttl` of 9ms is too short for a renewed lock: a renewed lock needs a ttl \
                       of at least 10ms (it is renewed every ttl/3 and is valid for ttl minus a \
                       1 % + 2 ms drift margin); write `ttl = \"10ms\"` or more, or remove `renew`";
        assert_eq!(error(quote!(key = "job", ttl = "9ms", renew)), message);
        assert_eq!(error(quote!(key = "job", renew, ttl = "9ms")), message);

        for args in [
            quote!(key = "job", renew, ttl = "10ms"),
            quote!(key = "job", renew),
            quote!(key = "job", ttl = "1ms"),
        ] {
            assert!(parse(args.clone()).is_ok(), "`{args}` was rejected");
        }
    }

    #[test]
    fn read_write_and_permits_choose_the_kind() {
        let kind = |args| parse(args).unwrap().kind;
        assert_eq!(kind(quote!(key = "job")), LockKind::Exclusive);
        assert_eq!(kind(quote!(key = "job", read)), LockKind::Read);
        assert_eq!(kind(quote!(write, key = "job")), LockKind::Write);
        assert_eq!(
            kind(quote!(key = "job", permits = 4)),
            LockKind::Semaphore(4)
        );
        assert_eq!(
            kind(quote!(key = "job", permits = 4u32)),
            LockKind::Semaphore(4)
        );
        assert_eq!(
            kind(quote!(key = "job", permits = 1)),
            LockKind::Semaphore(1)
        );
        assert_eq!(
            kind(quote!(key = "job", permits = 4_294_967_295)),
            LockKind::Semaphore(u32::MAX)
        );
        assert_eq!(
            kind(quote!(key = "job", permits = 0x10)),
            LockKind::Semaphore(16)
        );

        // What each kind takes.
        for args in [
            quote!(
                key = "job",
                read,
                ttl = "1s",
                wait = "1s",
                renew,
                max_hold = "1m",
                on_lost = "continue",
                fair,
                fencing,
                client = app.locks
            ),
            quote!(
                key = "job",
                write,
                ttl = "1s",
                wait = "1s",
                renew,
                fair,
                fencing,
                hold_at_least = "5s"
            ),
            quote!(
                key = "job",
                permits = 3,
                ttl = "1s",
                wait = "1s",
                renew,
                max_hold = "1m",
                on_lost = "continue",
                fair,
                client = app.locks
            ),
            quote!(key = "job", fencing, hold_at_least = "5s"),
        ] {
            assert!(parse(args.clone()).is_ok(), "`{args}` was rejected");
        }
    }

    #[test]
    fn read_write_and_permits_exclude_each_other() {
        assert_eq!(
            error(quote!(key = "job", read, write)),
            "`write` cannot be combined with `read`: the function takes the read/write lock \
             either for reading (`read`, shared with other readers) or for writing (`write`, \
             alone); keep one of them"
        );
        assert_eq!(
            error(quote!(key = "job", write, read)),
            "`read` cannot be combined with `write`: the function takes the read/write lock \
             either for reading (`read`, shared with other readers) or for writing (`write`, \
             alone); keep one of them"
        );
        assert_eq!(
            error(quote!(key = "job", read, permits = 2)),
            "`permits` cannot be combined with `read`: `permits = N` makes the lock a semaphore \
             of N permits, `read` a read/write lock taken for reading; keep one of them"
        );
        assert_eq!(
            error(quote!(key = "job", permits = 2, write)),
            "`write` cannot be combined with `permits`: `write` makes the lock a read/write lock \
             taken for writing, `permits = N` a semaphore of N permits; keep one of them"
        );
        assert_eq!(
            error(quote!(key = "job", permits = 2, read)),
            "`read` cannot be combined with `permits`: `read` makes the lock a read/write lock \
             taken for reading, `permits = N` a semaphore of N permits; keep one of them"
        );
    }

    #[test]
    fn permits_takes_an_integer_from_1_to_u32_max() {
        assert_eq!(
            error(quote!(key = "job", permits = 0)),
            "`permits = 0` would let nobody in: a semaphore needs at least 1 permit; write \
             `permits = 1` or more"
        );
        assert_eq!(
            error(quote!(key = "job", permits = 0u32)),
            "`permits = 0` would let nobody in: a semaphore needs at least 1 permit; write \
             `permits = 1` or more"
        );
        assert_eq!(
            error(quote!(key = "job", permits = 4294967296)),
            "`permits` of 4294967296 is over the limit of 4294967295 (u32::MAX); write \
             `permits = 4294967295` or less"
        );
        assert_eq!(
            error(quote!(
                key = "job",
                permits = 100000000000000000000000000000000000000000
            )),
            "`permits` of 100000000000000000000000000000000000000000 is over the limit of \
             4294967295 (u32::MAX); write `permits = 4294967295` or less"
        );
        let not_a_literal = "`permits` takes an integer literal from 1 to 4294967295 \
                             (u32::MAX): write `permits = 4` (the attribute reads the number \
                             itself, so a string, a constant or an expression cannot be used)";
        for value in [
            quote!("4"),
            quote!(2 + 2),
            quote!(MAX_EXPORTS),
            quote!(-1),
            quote!(4.0),
            quote!(true),
        ] {
            assert_eq!(
                error(quote!(key = "job", permits = #value)),
                not_a_literal,
                "for {value}"
            );
        }
        assert_eq!(
            error(quote!(key = "job", permits = 4u64)),
            "`permits` is a `u32`: write `permits = 4` without the `u64` suffix"
        );
        assert_eq!(
            error(quote!(key = "job", permits)),
            "`permits` needs a value, the number of callers let in at once (from 1 to \
             4294967295): write `permits = 4`"
        );
    }

    #[test]
    fn a_semaphore_takes_no_fencing_or_hold_at_least() {
        let fencing = "`fencing` does not apply to a semaphore (`permits = N`): a fencing token \
                       orders holders one after another, and a semaphore has several holders at \
                       once; remove `fencing`, or remove `permits` for an exclusive lock";
        assert_eq!(error(quote!(key = "job", permits = 2, fencing)), fencing);
        assert_eq!(error(quote!(key = "job", fencing, permits = 2)), fencing);
        let hold_at_least = "`hold_at_least` does not apply to a semaphore (`permits = N`): a \
                             semaphore has several holders at once, and a permit kept after the \
                             body would only keep the next caller out; remove `hold_at_least`, \
                             or remove `permits` for an exclusive lock";
        assert_eq!(
            error(quote!(key = "job", permits = 2, hold_at_least = "1s")),
            hold_at_least
        );
        assert_eq!(
            error(quote!(key = "job", hold_at_least = "1s", permits = 2)),
            hold_at_least
        );
    }

    #[test]
    fn a_read_lock_takes_no_hold_at_least() {
        let message = "`hold_at_least` does not apply to `read`: a read share kept after the \
                       body would hold writers off; remove `hold_at_least` (only an exclusive \
                       lock or `write` takes it)";
        assert_eq!(
            error(quote!(key = "job", read, hold_at_least = "1s")),
            message
        );
        assert_eq!(
            error(quote!(key = "job", hold_at_least = "1s", read)),
            message
        );
    }

    #[test]
    fn read_write_and_permits_are_given_once() {
        assert_eq!(
            error(quote!(key = "job", read, read)),
            "`read` is given twice: keep one"
        );
        assert_eq!(
            error(quote!(key = "job", write, write)),
            "`write` is given twice: keep one"
        );
        assert_eq!(
            error(quote!(key = "job", permits = 2, permits = 3)),
            "`permits` is given twice: keep one"
        );
        assert_eq!(
            error(quote!(key = "job", read = true)),
            "`read` is a flag and takes no value: write `read`"
        );
        assert_eq!(
            error(quote!(key = "job", tll = "10s")),
            "unknown argument `tll`: did you mean `ttl`?"
        );
        assert_eq!(
            error(quote!(key = "job", fence)),
            "unknown argument `fence`: did you mean `fencing`?"
        );
        assert_eq!(
            error(quote!(key = "job", shared)),
            "unknown argument `shared`: expected `key`, `ttl`, `wait`, `renew`, `max_hold`, \
             `on_lost`, `fair`, `fencing`, `hold_at_least`, `read`, `write`, `permits`, \
             `client` or `crate`"
        );
    }
}

//! Parsing the attribute's arguments: `key = "...", ttl = "...", wait = "..."`.

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::LitStr;

use crate::duration::parse_duration;

const ARGUMENTS: &str =
    "`key`, `ttl`, `wait`, `renew`, `max_hold`, `on_lost`, `fair`, `fencing` or `hold_at_least`";

/// The checked arguments.
pub(crate) struct LockArgs {
    pub(crate) key: LitStr,
    pub(crate) ttl_ms: Option<u64>,
    pub(crate) wait_ms: Option<u64>,
    pub(crate) renew: bool,
    pub(crate) max_hold_ms: Option<u64>,
    /// `on_lost = "continue"`; `"stop"` is the default and emits nothing.
    pub(crate) continue_on_lost: bool,
    pub(crate) fair: bool,
    pub(crate) fencing: bool,
    pub(crate) hold_at_least_ms: Option<u64>,
}

#[derive(Default)]
pub(crate) struct ArgsParser {
    key: Option<LitStr>,
    ttl_ms: Option<u64>,
    wait_ms: Option<u64>,
    renew: Option<Span>,
    max_hold_ms: Option<(u64, Span)>,
    on_lost: Option<(bool, Span)>,
    fair: Option<Span>,
    fencing: Option<Span>,
    hold_at_least_ms: Option<u64>,
}

impl ArgsParser {
    pub(crate) fn parse(&mut self, meta: ParseNestedMeta) -> syn::Result<()> {
        let Some(name) = meta.path.get_ident().map(|ident| ident.to_string()) else {
            return Err(meta.error(format!("unknown argument: expected {ARGUMENTS}")));
        };
        match name.as_str() {
            "key" => {
                let literal = string_value(&meta, &name, "\"order:<order_id>\"")?;
                set_once(&meta, &name, &mut self.key, literal)
            }
            "ttl" => {
                let literal = string_value(&meta, &name, "\"10s\"")?;
                let millis = parse_duration(&name, &literal)?;
                set_once(&meta, &name, &mut self.ttl_ms, millis)
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
                set_once(&meta, &name, &mut self.hold_at_least_ms, millis)
            }
            "max_hold" => {
                let literal = string_value(&meta, &name, "\"10m\"")?;
                let millis = parse_duration(&name, &literal)?;
                set_once(
                    &meta,
                    &name,
                    &mut self.max_hold_ms,
                    (millis, literal.span()),
                )
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
            other => Err(meta.error(format!("unknown argument `{other}`: expected {ARGUMENTS}"))),
        }
    }

    pub(crate) fn finish(self) -> syn::Result<LockArgs> {
        let Some(key) = self.key else {
            return Err(syn::Error::new(
                Span::call_site(),
                "missing `key`: name the lock, e.g. #[distributed_lock(key = \"order:<order_id>\")]",
            ));
        };
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
        Ok(LockArgs {
            key,
            ttl_ms: self.ttl_ms,
            wait_ms: self.wait_ms,
            renew: self.renew.is_some(),
            max_hold_ms: self.max_hold_ms.map(|(millis, _)| millis),
            continue_on_lost: self
                .on_lost
                .is_some_and(|(continue_on_lost, _)| continue_on_lost),
            fair: self.fair.is_some(),
            fencing: self.fencing.is_some(),
            hold_at_least_ms: self.hold_at_least_ms,
        })
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

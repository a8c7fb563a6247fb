//! Parsing the attribute's arguments: `key = "...", ttl = "...", wait = "..."`.

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::LitStr;

use crate::duration::parse_duration;

const ARGUMENTS: &str = "`key`, `ttl` or `wait`";

/// The checked arguments.
pub(crate) struct LockArgs {
    pub(crate) key: LitStr,
    pub(crate) ttl_ms: Option<u64>,
    pub(crate) wait_ms: Option<u64>,
}

#[derive(Default)]
pub(crate) struct ArgsParser {
    key: Option<LitStr>,
    ttl_ms: Option<u64>,
    wait_ms: Option<u64>,
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
        Ok(LockArgs {
            key,
            ttl_ms: self.ttl_ms,
            wait_ms: self.wait_ms,
        })
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

//! The key template: literal text with `<name>` placeholders, each naming a
//! parameter of the function or a field path under one (`<order.id>`,
//! `<self.shard>`), rendered with `Display`.

use proc_macro2::TokenStream;
use quote::quote_spanned;
use syn::{FnArg, LitStr, Pat, Signature};

/// A key template turned into `format!` arguments.
pub(crate) struct KeyTemplate {
    /// The format string, braces of the literal text escaped.
    pub(crate) format: String,
    /// One expression a placeholder, in order.
    pub(crate) args: Vec<TokenStream>,
}

/// The names a placeholder may start with: `self` for methods, then every
/// parameter bound to a plain identifier.
fn parameter_names(signature: &Signature) -> Vec<String> {
    signature
        .inputs
        .iter()
        .filter_map(|input| match input {
            FnArg::Receiver(_) => Some("self".to_owned()),
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(ident) => Some(ident.ident.to_string()),
                _ => None,
            },
        })
        .collect()
}

pub(crate) fn parse_key(literal: &LitStr, signature: &Signature) -> syn::Result<KeyTemplate> {
    let text = literal.value();
    let error = |message: String| syn::Error::new(literal.span(), message);
    if text.is_empty() {
        return Err(error(
            "the key is empty: name the locked resource, e.g. key = \"order:<order_id>\"".into(),
        ));
    }
    let parameters = parameter_names(signature);
    let mut template = KeyTemplate {
        format: String::new(),
        args: Vec::new(),
    };
    let mut rest = text.as_str();
    while let Some(position) = rest.find(['<', '>']) {
        push_literal(&mut template.format, &rest[..position]);
        if rest.as_bytes()[position] == b'>' {
            return Err(error(format!(
                "unbalanced `>` in key \"{text}\": placeholders are written `<name>`"
            )));
        }
        let after = &rest[position + 1..];
        let Some(close) = after
            .find(['<', '>'])
            .filter(|&i| after.as_bytes()[i] == b'>')
        else {
            return Err(error(format!(
                "unclosed `<` in key \"{text}\": close the placeholder with `>`, e.g. `<order_id>`"
            )));
        };
        let path = after[..close].trim();
        if path.is_empty() {
            return Err(error(format!(
                "empty placeholder `<>` in key \"{text}\": write a parameter name inside; {}",
                listing(&parameters)
            )));
        }
        template
            .args
            .push(placeholder_expr(path, &parameters, literal, &text)?);
        template.format.push_str("{}");
        rest = &after[close + 1..];
    }
    push_literal(&mut template.format, rest);
    Ok(template)
}

fn push_literal(format: &mut String, text: &str) {
    format.push_str(&text.replace('{', "{{").replace('}', "}}"));
}

/// The end of an error message: what the placeholder may name.
fn listing(parameters: &[String]) -> String {
    if parameters.is_empty() {
        "this function has no parameter a key can use (destructured parameters cannot be \
         used: bind the parameter to a name)"
            .to_owned()
    } else {
        let names: Vec<String> = parameters.iter().map(|name| format!("`{name}`")).collect();
        format!("use one of: {}", names.join(", "))
    }
}

/// `order.id` -> `order.id` as an expression, after checking that `order` is
/// a parameter and every segment is a field name or tuple index.
fn placeholder_expr(
    path: &str,
    parameters: &[String],
    literal: &LitStr,
    text: &str,
) -> syn::Result<TokenStream> {
    let error = |message: String| syn::Error::new(literal.span(), message);
    let mut segments = path.split('.');
    let root = segments.next().unwrap_or_default().trim();
    if !parameters.iter().any(|name| name == root) {
        return Err(error(format!(
            "unknown placeholder `<{path}>` in key \"{text}\": `{root}` is not a parameter; {}",
            listing(parameters)
        )));
    }
    let span = literal.span();
    let mut expr = if root == "self" {
        quote_spanned!(span=> self)
    } else {
        let mut ident: syn::Ident = syn::parse_str(root)
            .map_err(|_| error(format!("invalid placeholder `<{path}>` in key \"{text}\"")))?;
        ident.set_span(span);
        quote_spanned!(span=> #ident)
    };
    for segment in segments {
        let segment = segment.trim();
        match syn::parse_str::<syn::Member>(segment) {
            Ok(syn::Member::Named(mut field)) => {
                field.set_span(span);
                expr = quote_spanned!(span=> #expr.#field);
            }
            Ok(syn::Member::Unnamed(index)) => {
                let index = syn::Index {
                    index: index.index,
                    span,
                };
                expr = quote_spanned!(span=> #expr.#index);
            }
            Err(_) => {
                return Err(error(format!(
                    "invalid placeholder `<{path}>` in key \"{text}\": `{segment}` is not a field \
                     name or tuple index; write a parameter followed by fields, e.g. `<order.id>`"
                )))
            }
        }
    }
    Ok(expr)
}

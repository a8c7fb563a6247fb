//! The key template: literal text with `<name>` placeholders, each naming a
//! parameter of the function (or a name a parameter pattern binds: `id` in
//! `Path(id): Path<u64>`) or a field path under one (`<order.id>`,
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
/// name a parameter binds, in order: a plain parameter's name and each name
/// bound inside a destructuring pattern (`Path(id)`, `(a, b)`,
/// `Order { id, .. }`, `Order { id: order_id, .. }`, `x @ ..`, `&(a, b)`).
fn parameter_names(signature: &Signature) -> Vec<String> {
    let mut names = Vec::new();
    for input in &signature.inputs {
        match input {
            FnArg::Receiver(_) => names.push("self".to_owned()),
            FnArg::Typed(typed) => bound_names(&typed.pat, &mut names),
        }
    }
    names
}

/// Pushes the names `pattern` binds. `_`, `..`, literals, ranges, paths and
/// constants bind nothing; a macro in pattern position cannot be seen into.
fn bound_names(pattern: &Pat, names: &mut Vec<String>) {
    match pattern {
        Pat::Ident(ident) => {
            let name = ident.ident.to_string();
            if !names.contains(&name) {
                names.push(name);
            }
            if let Some((_, subpattern)) = &ident.subpat {
                bound_names(subpattern, names);
            }
        }
        Pat::Reference(reference) => bound_names(&reference.pat, names),
        Pat::Paren(paren) => bound_names(&paren.pat, names),
        Pat::Type(typed) => bound_names(&typed.pat, names),
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::Struct(structure) => structure
            .fields
            .iter()
            .for_each(|field| bound_names(&field.pat, names)),
        // Every alternative binds the same names.
        Pat::Or(or) => {
            if let Some(first) = or.cases.first() {
                bound_names(first, names);
            }
        }
        _ => {}
    }
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
    check_format_style(literal, &text, &parameters)?;
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

/// `{id}` where `id` is a parameter (or `{order.id}`, a field path under one)
/// is a placeholder written as in `format!`: braces are literal text in a
/// key, so every call would share the one lock named `order:{id}`. Braces
/// that name no parameter (a Redis hash tag such as `{tenant}`) stay literal.
fn check_format_style(literal: &LitStr, text: &str, parameters: &[String]) -> syn::Result<()> {
    let mut found: Vec<(usize, &str, &str)> = Vec::new();
    let mut from = 0;
    while let Some(open) = text[from..].find('{').map(|i| from + i) {
        let Some(close) = text[open + 1..].find(['{', '}']).map(|i| open + 1 + i) else {
            break;
        };
        if text.as_bytes()[close] == b'{' {
            from = close;
            continue;
        }
        let inside = &text[open + 1..close];
        // `{id}`, `{ order.id }`, and `{id:?}` as `format!` would take it.
        let path = inside.strip_suffix(":?").unwrap_or(inside).trim();
        let written = &text[open..=close];
        if !path.is_empty()
            && !path.contains(['<', '>'])
            && placeholder_expr(path, parameters, literal, text).is_ok()
        {
            found.push((open, written, path));
        }
        from = close + 1;
    }
    let Some(&(first, written, path)) = found.first() else {
        return Ok(());
    };
    let mut fixed = text.to_owned();
    for &(_, written, path) in found.iter().rev() {
        if let Some(at) = fixed.rfind(written) {
            fixed.replace_range(at..at + written.len(), &format!("<{path}>"));
        }
    }
    let root = path.split('.').next().unwrap_or(path).trim();
    let message = format!(
        "`{written}` in key \"{text}\" is literal text, not a placeholder: every call would \
         share the one lock named `{text}`; placeholders are written `<name>`, so write \
         `key = \"{fixed}\"` to put the value of `{root}` in the key (braces are kept as they \
         are, e.g. a Redis hash tag `{{tenant}}`; around a value: `{{<{path}>}}`)"
    );
    Err(syn::Error::new(
        subspan(literal, first, written.len()),
        message,
    ))
}

/// The span of `len` bytes of `literal`'s value from byte `start`, where the
/// compiler can give one (a nightly compiler); the whole literal otherwise.
fn subspan(literal: &LitStr, start: usize, len: usize) -> proc_macro2::Span {
    let token = literal.token();
    let source = token.to_string();
    let value = literal.value();
    // The value's bytes sit in the source after the opening quote (`"`,
    // `r"`, `r#"`) only when nothing in it is escaped.
    let Some(quote) = source.find('"') else {
        return literal.span();
    };
    let body = quote + 1;
    if source.get(body..body + value.len()) != Some(value.as_str()) {
        return literal.span();
    }
    token
        .subspan(body + start..body + start + len)
        .unwrap_or_else(|| literal.span())
}

fn push_literal(format: &mut String, text: &str) {
    format.push_str(&text.replace('{', "{{").replace('}', "}}"));
}

/// The end of an error message: what the placeholder may name.
fn listing(parameters: &[String]) -> String {
    if parameters.is_empty() {
        "this function has no parameter a key can use: write the key without placeholders, or \
         add the parameter"
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
        let names: Vec<&str> = parameters.iter().map(String::as_str).collect();
        let advice = match crate::suggest::closest(root, &names) {
            Some(meant) => format!("did you mean `{meant}`?"),
            None => listing(parameters),
        };
        return Err(error(format!(
            "unknown placeholder `<{path}>` in key \"{text}\": `{root}` is not a parameter; \
             {advice}"
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

#[cfg(test)]
mod tests {
    use proc_macro2::Span;
    use syn::{LitStr, Signature};

    use super::parse_key;

    /// Every parameter form a key can name: a receiver, plain names, a
    /// struct, a tuple, a raw identifier, a destructured parameter, and a
    /// parameter that binds nothing.
    fn signature() -> Signature {
        syn::parse_quote! {
            async fn settle(
                &self,
                order_id: u64,
                order: &Order,
                pair: (u8, (u16, u32)),
                r#type: u8,
                (left, _): (u8, u8),
                _: u32,
            )
        }
    }

    /// The names a pattern binds, in order.
    fn names(signature: Signature) -> Vec<String> {
        super::parameter_names(&signature)
    }

    /// The format string and the placeholder expressions, without spaces.
    fn parse(text: &str) -> syn::Result<(String, Vec<String>)> {
        let template = parse_key(&LitStr::new(text, Span::call_site()), &signature())?;
        let args = template
            .args
            .iter()
            .map(|arg| arg.to_string().replace(' ', ""))
            .collect();
        Ok((template.format, args))
    }

    fn error(text: &str) -> String {
        match parse(text) {
            Ok(parsed) => panic!("{text:?} was accepted: {parsed:?}"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn every_placeholder_form() {
        let cases: &[(&str, &str, &[&str])] = &[
            ("job", "job", &[]),
            ("order:<order_id>", "order:{}", &["order_id"]),
            ("order:<order.id>", "order:{}", &["order.id"]),
            ("<order.customer.id>", "{}", &["order.customer.id"]),
            ("<self>", "{}", &["self"]),
            ("shard:<self.shard>", "shard:{}", &["self.shard"]),
            ("<pair.0>-<pair.1.1>", "{}-{}", &["pair.0", "pair.1.1"]),
            ("kind:<r#type>", "kind:{}", &["r#type"]),
            ("<left>", "{}", &["left"]),
            (
                "< order_id >:<order . id>",
                "{}:{}",
                &["order_id", "order.id"],
            ),
            (
                "a<order_id>b<order_id>c",
                "a{}b{}c",
                &["order_id", "order_id"],
            ),
            ("{json}:<order_id>:}{", "{{json}}:{}:}}{{", &["order_id"]),
            ("ключ:<order_id>", "ключ:{}", &["order_id"]),
        ];
        for &(text, format, args) in cases {
            let (parsed_format, parsed_args) =
                parse(text).unwrap_or_else(|error| panic!("{text:?}: {error}"));
            assert_eq!(parsed_format, format, "for {text:?}");
            assert_eq!(parsed_args, args, "for {text:?}");
        }
    }

    #[test]
    fn every_error_says_what_to_write() {
        let cases = [
            (
                "",
                "the key is empty: name the locked resource, e.g. key = \"order:<order_id>\"",
            ),
            (
                "a>b",
                "unbalanced `>` in key \"a>b\": placeholders are written `<name>`",
            ),
            (
                "a<order_id",
                "unclosed `<` in key \"a<order_id\": close the placeholder with `>`, e.g. \
                 `<order_id>`",
            ),
            (
                "a<order_id<x>",
                "unclosed `<` in key \"a<order_id<x>\": close the placeholder with `>`, e.g. \
                 `<order_id>`",
            ),
            (
                "a< >",
                "empty placeholder `<>` in key \"a< >\": write a parameter name inside; use one \
                 of: `self`, `order_id`, `order`, `pair`, `r#type`, `left`",
            ),
            (
                "<right>",
                "unknown placeholder `<right>` in key \"<right>\": `right` is not a parameter; \
                 use one of: `self`, `order_id`, `order`, `pair`, `r#type`, `left`",
            ),
            (
                "<_>",
                "unknown placeholder `<_>` in key \"<_>\": `_` is not a parameter; use one of: \
                 `self`, `order_id`, `order`, `pair`, `r#type`, `left`",
            ),
            (
                "<order.type>",
                "invalid placeholder `<order.type>` in key \"<order.type>\": `type` is not a \
                 field name or tuple index; write a parameter followed by fields, e.g. \
                 `<order.id>`",
            ),
            (
                "<order.>",
                "invalid placeholder `<order.>` in key \"<order.>\": `` is not a field name or \
                 tuple index; write a parameter followed by fields, e.g. `<order.id>`",
            ),
        ];
        for (text, message) in cases {
            assert_eq!(error(text), message, "for {text:?}");
        }
    }

    #[test]
    fn format_style_braces_naming_a_parameter_are_refused() {
        let cases = [
            (
                "order:{order_id}",
                "`{order_id}` in key \"order:{order_id}\" is literal text, not a placeholder: \
                 every call would share the one lock named `order:{order_id}`; placeholders are \
                 written `<name>`, so write `key = \"order:<order_id>\"` to put the value of \
                 `order_id` in the key (braces are kept as they are, e.g. a Redis hash tag \
                 `{tenant}`; around a value: `{<order_id>}`)",
            ),
            (
                "order:{ order.id }:{left}",
                "`{ order.id }` in key \"order:{ order.id }:{left}\" is literal text, not a \
                 placeholder: every call would share the one lock named `order:{ order.id \
                 }:{left}`; placeholders are written `<name>`, so write `key = \
                 \"order:<order.id>:<left>\"` to put the value of `order` in the key (braces are \
                 kept as they are, e.g. a Redis hash tag `{tenant}`; around a value: \
                 `{<order.id>}`)",
            ),
        ];
        for (text, message) in cases {
            assert_eq!(error(text), message, "for {text:?}");
        }
        // As `format!` would take them too, beside real placeholders.
        for text in [
            "{self.shard}",
            "<left>:{pair.1.0}",
            "{order_id:?}",
            "{{order_id}}",
        ] {
            assert!(
                error(text).contains("is literal text, not a placeholder"),
                "for {text:?}"
            );
        }
    }

    #[test]
    fn braces_naming_no_parameter_stay_literal() {
        let cases: &[(&str, &str, &[&str])] = &[
            // Hash tags: the lock's keys in the slot of `tenant`.
            ("{tenant}:job", "{{tenant}}:job", &[]),
            (
                "{tenant}:order:<order_id>",
                "{{tenant}}:order:{}",
                &["order_id"],
            ),
            // A hash tag around a parameter's value.
            ("{<order_id>}:job", "{{{}}}:job", &["order_id"]),
            ("{}", "{{}}", &[]),
            ("{order_id", "{{order_id", &[]),
            ("order_id}", "order_id}}", &[]),
            ("{order.type}", "{{order.type}}", &[]),
            ("{order_id:x}", "{{order_id:x}}", &[]),
        ];
        for &(text, format, args) in cases {
            let (parsed_format, parsed_args) =
                parse(text).unwrap_or_else(|error| panic!("{text:?}: {error}"));
            assert_eq!(parsed_format, format, "for {text:?}");
            assert_eq!(parsed_args, args, "for {text:?}");
        }
    }

    #[test]
    fn a_misspelt_placeholder_gets_a_suggestion() {
        assert_eq!(
            error("order:<ordr_id>"),
            "unknown placeholder `<ordr_id>` in key \"order:<ordr_id>\": `ordr_id` is not a \
             parameter; did you mean `order_id`?"
        );
        assert_eq!(
            error("<slef.shard>"),
            "unknown placeholder `<slef.shard>` in key \"<slef.shard>\": `slef` is not a \
             parameter; did you mean `self`?"
        );
    }

    #[test]
    fn every_pattern_binds_its_names() {
        let bound = names(syn::parse_quote! {
            async fn handler(
                State(app): State<App>,
                Path(id): Path<u64>,
                (a, (b, _)): (u8, (u8, u8)),
                Order { id: order_id, customer: Customer { name, .. }, .. }: Order,
                Shipment { ref carrier, mut weight, .. }: Shipment,
                Json(ref mut req): Json<Request>,
                whole @ Wrapper(inner): Wrapper,
                &(x, y): &(u8, u8),
                &mut Counter(count): &mut Counter,
                [first, .., last]: [u8; 4],
                (Left(either) | Right(either)): Either,
                mut plain: u8,
                _: u8,
                (..): (u8, u8),
                Marker { .. }: Marker,
            )
        });
        let expected = [
            "app", "id", "a", "b", "order_id", "name", "carrier", "weight", "req", "whole",
            "inner", "x", "y", "count", "first", "last", "either", "plain",
        ];
        assert_eq!(bound, expected);

        let method = names(syn::parse_quote! {
            async fn handle(&mut self, Path((shard, r#ref)): Path<(u8, u8)>)
        });
        assert_eq!(method, ["self", "shard", "r#ref"]);

        let none = names(syn::parse_quote! {
            async fn nothing(_: u8, (_, _): (u8, u8), Unit { .. }: Unit)
        });
        assert!(none.is_empty(), "{none:?}");
    }

    #[test]
    fn destructured_names_take_field_paths() {
        let signature: Signature = syn::parse_quote! {
            async fn settle(State(app): State<App>, Json(req): Json<Request>)
        };
        let template = parse_key(
            &LitStr::new("order:<req.order_id>:<app.region.0>", Span::call_site()),
            &signature,
        )
        .unwrap();
        assert_eq!(template.format, "order:{}:{}");
        let args: Vec<String> = template
            .args
            .iter()
            .map(|arg| arg.to_string().replace(' ', ""))
            .collect();
        assert_eq!(args, ["req.order_id", "app.region.0"]);

        let error = parse_key(&LitStr::new("order:<id>", Span::call_site()), &signature)
            .err()
            .expect("`id` is not bound")
            .to_string();
        assert_eq!(
            error,
            "unknown placeholder `<id>` in key \"order:<id>\": `id` is not a parameter; use one \
             of: `app`, `req`"
        );

        let nothing: Signature = syn::parse_quote!(async fn tick(_: u8));
        let error = parse_key(&LitStr::new("tick:<n>", Span::call_site()), &nothing)
            .err()
            .expect("nothing is bound")
            .to_string();
        assert_eq!(
            error,
            "unknown placeholder `<n>` in key \"tick:<n>\": `n` is not a parameter; this \
             function has no parameter a key can use: write the key without placeholders, or add \
             the parameter"
        );
    }

    mod properties {
        use proptest::prelude::*;

        use super::parse;

        /// An error names what to write instead.
        fn says_what_to_write(message: &str) -> bool {
            !message.trim().is_empty()
                && ["write", "written", "e.g.", "use one of", "did you mean"]
                    .iter()
                    .any(|advice| message.contains(advice))
        }

        fn check(text: &str) -> Result<(), TestCaseError> {
            if let Err(error) = parse(text) {
                let message = error.to_string();
                prop_assert!(says_what_to_write(&message), "{text:?}: {message}");
            }
            Ok(())
        }

        /// A placeholder a key may hold, as written and as the expression.
        fn placeholder() -> impl Strategy<Value = (String, String)> {
            prop_oneof![
                Just(("order_id", "order_id")),
                Just(("order.id", "order.id")),
                Just(("self.shard", "self.shard")),
                Just(("self", "self")),
                Just((" pair . 1 . 0 ", "pair.1.0")),
                Just(("r#type", "r#type")),
            ]
            .prop_map(|(written, expr)| (written.to_owned(), expr.to_owned()))
        }

        proptest! {
            // No regression files written beside the sources.
            #![proptest_config(ProptestConfig {
                failure_persistence: None,
                ..ProptestConfig::default()
            })]

            #[test]
            fn arbitrary_keys_never_panic(text in any::<String>()) {
                check(&text)?;
            }

            #[test]
            fn key_like_strings_never_panic(
                text in "([a-z_:{}# ]|<|>|\\.|self|order|pair|[0-9]|r#|é){0,16}",
            ) {
                check(&text)?;
            }

            #[test]
            fn text_without_angle_brackets_is_literal(text in "[^<>]{1,40}") {
                let (format, args) = parse(&text)
                    .map_err(|error| TestCaseError::fail(format!("{text:?}: {error}")))?;
                prop_assert!(args.is_empty());
                prop_assert_eq!(format, text.replace('{', "{{").replace('}', "}}"));
            }

            #[test]
            fn valid_templates_are_accepted(
                parts in proptest::collection::vec(("[^<>]{0,6}", placeholder()), 0..5),
                end in "[^<>]{0,6}",
            ) {
                let mut text = String::new();
                let mut format = String::new();
                let mut expected = Vec::new();
                for (literal, (written, expr)) in &parts {
                    text.push_str(&format!("{literal}<{written}>"));
                    format.push_str(&literal.replace('{', "{{").replace('}', "}}"));
                    format.push_str("{}");
                    expected.push(expr.clone());
                }
                text.push_str(&end);
                format.push_str(&end.replace('{', "{{").replace('}', "}}"));
                prop_assume!(!text.is_empty());
                let parsed = parse(&text)
                    .map_err(|error| TestCaseError::fail(format!("{text:?}: {error}")))?;
                prop_assert_eq!(parsed, (format, expected));
            }
        }
    }
}

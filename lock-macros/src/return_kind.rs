//! Checking that the return type can say "the lock was not acquired".

use syn::{ReturnType, Type};

/// Accepts `()` (or no return type), `Option<T>`, and any path whose last
/// segment ends in `Result` (`Result<T, E>`, `io::Result<T>`,
/// `anyhow::Result<T>`, `JobResult`). The runtime's `NotAcquired` trait then
/// checks the real type, e.g. that `E: From<LockError>`.
pub(crate) fn check_return_type(output: &ReturnType) -> syn::Result<()> {
    let ty = match output {
        ReturnType::Default => return Ok(()),
        ReturnType::Type(_, ty) => ty,
    };
    if accepts(ty) {
        return Ok(());
    }
    Err(syn::Error::new_spanned(
        ty,
        "#[distributed_lock] cannot tell the caller that the lock was not acquired through this \
         return type: return `Result<T, E>` (with `E: From<lock_runtime::LockError>`), \
         `Option<T>` or `()`",
    ))
}

fn accepts(ty: &Type) -> bool {
    match ty {
        Type::Tuple(tuple) => tuple.elems.is_empty(),
        Type::Paren(inner) => accepts(&inner.elem),
        Type::Group(inner) => accepts(&inner.elem),
        Type::Path(path) if path.qself.is_none() => path
            .path
            .segments
            .last()
            .map(|segment| {
                let name = segment.ident.to_string();
                name == "Option" || name.ends_with("Result")
            })
            .unwrap_or(false),
        _ => false,
    }
}

//! No import cycles in lock-runtime/src (docs/design.md §10, "Code layout").
//!
//! Every reference of one file to another's items (`use crate::...`,
//! `use super::...`, `crate::a::b(...)` and `super::x` in code, tests
//! included) is an edge between the two files, followed through re-exports
//! (`pub(crate) use child::Item` in a `mod.rs`) to the file that defines the
//! item. Edges are compared within each folder: two files or subfolders of
//! one folder (a subfolder counts as one, everything in it together) must
//! not depend on each other, directly or through others of that folder. A
//! folder's own `mod.rs` is the folder: what it defines is below its
//! children, and its re-exports are not edges.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module: its path from the crate root (`["backend", "notify"]`).
type ModPath = Vec<String>;

#[test]
fn no_folder_has_an_import_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let crate_ = Crate::read(&src);
    let edges = crate_.edges();
    assert!(
        edges.len() > 100,
        "only {} edges found: is the parser broken?",
        edges.len()
    );
    if std::env::var_os("IMPORT_EDGES").is_some() {
        for edge in &edges {
            eprintln!(
                "{} -> {}",
                crate_.file_name(&edge.from),
                crate_.file_name(&edge.to)
            );
        }
    }
    let cycles = cycles(&edges, &crate_);
    assert!(
        cycles.is_empty(),
        "import cycles in lock-runtime/src:\n{}",
        cycles.join("\n")
    );
}

/// The checker finds the cycles it is meant to find.
#[test]
fn a_cycle_between_siblings_is_found_and_parents_are_not_cycles() {
    let mut crate_ = Crate::default();
    let files = [
        (vec![], "mod a; mod b; mod c;"),
        (vec!["a"], "use crate::b::Thing; mod inner;"),
        // Through the parent's re-export: `crate::a::Inner` is a/inner.rs.
        (
            vec!["a", "inner"],
            "pub(crate) struct Inner; use super::Helper;",
        ),
        (
            vec!["b"],
            "pub(crate) struct Thing; fn f() { crate::c::g(); }",
        ),
        (
            vec!["c"],
            "// crate::b::Thing in a comment\nfn g() { let _ = \"crate::b\"; } \
             #[cfg(test)] mod tests { use super::*; use crate::a::Inner; }",
        ),
    ];
    for (path, text) in files {
        crate_.add(path.iter().map(|s| s.to_string()).collect(), text);
    }
    // a/mod.rs re-exports inner's item.
    crate_.add(
        vec!["a".to_owned()],
        "use crate::b::Thing; mod inner; pub(crate) use inner::Inner; pub(crate) struct Helper;",
    );
    let cycles = cycles(&crate_.edges(), &crate_);
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(
        cycles[0].starts_with("in src/: a -> b -> c -> a"),
        "{cycles:?}"
    );
    assert!(cycles[0].contains("c.rs -> a/inner.rs"), "{cycles:?}");
}

#[derive(Default)]
struct Crate {
    /// Each module defined by a file, and its text without comments and
    /// string literals.
    files: BTreeMap<ModPath, String>,
    /// Each module's file, relative to src/.
    names: BTreeMap<ModPath, String>,
}

/// A reference of file `from` to file `to` (module paths of files).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Edge {
    from: ModPath,
    to: ModPath,
}

impl Crate {
    fn read(src: &Path) -> Crate {
        let mut crate_ = Crate::default();
        let mut stack = vec![src.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|ext| ext == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    let module = module_of(src, &path);
                    crate_.add(module.clone(), &text);
                    let name = path.strip_prefix(src).unwrap().display().to_string();
                    crate_.names.insert(module, name);
                }
            }
        }
        crate_
    }

    fn add(&mut self, module: ModPath, text: &str) {
        self.files.insert(module, strip(text));
    }

    fn is_module(&self, path: &[String]) -> bool {
        self.files.contains_key(path)
    }

    /// Every file-to-file reference.
    fn edges(&self) -> BTreeSet<Edge> {
        let mut edges = BTreeSet::new();
        for (module, text) in &self.files {
            for reference in references(text) {
                let scope: ModPath = module.iter().chain(&reference.inline).cloned().collect();
                let Some(target) = self.resolve(module, &scope, &reference.path, 0) else {
                    continue;
                };
                let file = self.file_of(&target);
                if &file != module {
                    edges.insert(Edge {
                        from: module.clone(),
                        to: file,
                    });
                }
            }
        }
        edges
    }

    /// The file a module (maybe an inline one) is in.
    fn file_of(&self, module: &[String]) -> ModPath {
        let mut path = module.to_vec();
        while !self.is_module(&path) && !path.is_empty() {
            path.pop();
        }
        path
    }

    /// The module that defines what `path` (as written in `scope`, inside
    /// the file of `file`) names; `None` for another crate's.
    fn resolve(
        &self,
        file: &ModPath,
        scope: &ModPath,
        path: &[String],
        depth: usize,
    ) -> Option<ModPath> {
        if depth > 8 {
            return None;
        }
        let mut segments = path.iter().peekable();
        let mut at: ModPath = match segments.peek()?.as_str() {
            "crate" => {
                segments.next();
                Vec::new()
            }
            "self" => {
                segments.next();
                scope.clone()
            }
            "super" => {
                let mut at = scope.clone();
                while segments.peek().is_some_and(|s| *s == "super") {
                    segments.next();
                    at.pop();
                }
                at
            }
            first => {
                // A path relative to the scope (2018 edition): a child
                // module, or another crate.
                let mut child = scope.clone();
                child.push(first.to_owned());
                if !self.is_module(&child) && !self.is_inline(file, &child) {
                    return None;
                }
                scope.clone()
            }
        };
        for segment in segments {
            if segment == "*" {
                break;
            }
            let mut child = at.clone();
            child.push(segment.clone());
            if self.is_module(&child) || self.is_inline(file, &child) {
                at = child;
                continue;
            }
            // An item of `at`: defined there, or re-exported from elsewhere.
            let at_file = self.file_of(&at);
            if let Some(text) = self.files.get(&at_file) {
                let inline: Vec<String> = at[at_file.len()..].to_vec();
                for export in reexports(text) {
                    if export.inline == inline && export.name == *segment {
                        return self.resolve(&at_file, &at, &export.path, depth + 1);
                    }
                }
            }
            break;
        }
        Some(at)
    }

    /// Whether `module` is an inline module (`mod tests { .. }`) of `file`.
    fn is_inline(&self, file: &ModPath, module: &[String]) -> bool {
        module.len() > file.len()
            && module.starts_with(file)
            && self
                .files
                .get(file)
                .is_some_and(|text| references_inline_mods(text).contains(&module[file.len()..]))
    }
}

/// The module of a source file: `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`.
fn module_of(src: &Path, file: &Path) -> ModPath {
    let relative: PathBuf = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: ModPath = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// `text` without comments, string and character literals (their
/// characters replaced by spaces, so that positions are kept).
fn strip(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !chars
                .get(i.wrapping_sub(1))
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string: r"..", r#".."#.
            let mut hashes = 0;
            let mut j = i + 1;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &skipped in &chars[i..j.min(chars.len())] {
                blank(&mut out, skipped);
            }
            i = j;
        } else if c == '"' {
            blank(&mut out, c);
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
                if i < chars.len() {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
            if i < chars.len() {
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '\'' {
            // A character literal ('a', '\n', '\u{..}'), or a lifetime.
            let end = if next == Some('\\') {
                (i + 2..chars.len()).find(|&j| chars[j] == '\'')
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    for &skipped in &chars[i..=end] {
                        blank(&mut out, skipped);
                    }
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// One path as written, and the inline modules (`mod tests { .. }`) it is
/// written in.
struct Reference {
    inline: Vec<String>,
    path: Vec<String>,
}

/// A re-export (`pub use`, `pub(crate) use`): the name it gives, the path
/// it names, and the inline modules it is in.
struct Reexport {
    inline: Vec<String>,
    name: String,
    path: Vec<String>,
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The tokens of stripped source: identifiers, `::`, and single
/// punctuation characters.
fn tokens(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if is_ident_char(c) {
            let start = i;
            while i < chars.len() && is_ident_char(chars[i]) {
                i += 1;
            }
            tokens.push(chars[start..i].iter().collect());
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push("::".to_owned());
            i += 2;
        } else {
            tokens.push(c.to_string());
            i += 1;
        }
    }
    tokens
}

/// Walks the tokens, keeping track of inline modules; `visit` gets each
/// token's index and the inline modules it is in.
fn walk_scopes(tokens: &[String], mut visit: impl FnMut(usize, &[String])) {
    // (module name, brace depth inside it)
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let names: Vec<String> = inline.iter().map(|(name, _)| name.clone()).collect();
        visit(i, &names);
        match tokens[i].as_str() {
            "mod" if tokens.get(i + 2).is_some_and(|t| t == "{") => {
                depth += 1;
                inline.push((tokens[i + 1].clone(), depth));
                i += 3;
                continue;
            }
            "{" => depth += 1,
            "}" => {
                if inline.last().is_some_and(|(_, at)| *at == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        i += 1;
    }
}

/// The inline modules of a file, as paths below it.
fn references_inline_mods(text: &str) -> BTreeSet<Vec<String>> {
    let tokens = tokens(text);
    let mut mods = BTreeSet::new();
    walk_scopes(&tokens, |i, inline| {
        if tokens[i] == "mod" && tokens.get(i + 2).is_some_and(|t| t == "{") {
            let mut path = inline.to_vec();
            path.push(tokens[i + 1].clone());
            mods.insert(path);
        }
    });
    mods
}

/// Every path of a file that names an item of this crate: in `use`
/// declarations (each leaf of a `{..}` group), and `crate::..`,
/// `super::..` and `self::..` paths elsewhere.
fn references(text: &str) -> Vec<Reference> {
    let tokens = tokens(text);
    let mut references = Vec::new();
    let mut in_use_until = 0;
    walk_scopes(&tokens, |i, inline| {
        if i < in_use_until {
            return;
        }
        if tokens[i] == "use" && (i == 0 || tokens[i - 1] != "$") {
            let end = (i..tokens.len())
                .find(|&j| tokens[j] == ";")
                .unwrap_or(tokens.len());
            for (path, _) in use_tree(&tokens[i + 1..end]) {
                references.push(Reference {
                    inline: inline.to_vec(),
                    path,
                });
            }
            in_use_until = end;
            return;
        }
        let starts = matches!(tokens[i].as_str(), "crate" | "super" | "self")
            && tokens.get(i + 1).is_some_and(|t| t == "::")
            && (i == 0 || (tokens[i - 1] != "::" && tokens[i - 1] != "$"));
        if starts {
            let mut path = vec![tokens[i].clone()];
            let mut j = i + 1;
            while tokens.get(j).is_some_and(|t| t == "::")
                && tokens
                    .get(j + 1)
                    .is_some_and(|t| t.chars().all(is_ident_char))
            {
                path.push(tokens[j + 1].clone());
                j += 2;
            }
            references.push(Reference {
                inline: inline.to_vec(),
                path,
            });
        }
    });
    references
}

/// The re-exports of a file.
fn reexports(text: &str) -> Vec<Reexport> {
    let tokens = tokens(text);
    let mut exports = Vec::new();
    walk_scopes(&tokens, |i, inline| {
        if tokens[i] != "use" {
            return;
        }
        // `pub use`, `pub(crate) use`, `pub(super) use`, `pub(in x) use`.
        let public = tokens.get(i.wrapping_sub(1)).is_some_and(|t| t == "pub")
            || (tokens.get(i.wrapping_sub(1)).is_some_and(|t| t == ")")
                && (1..6).any(|back| {
                    tokens
                        .get(i.wrapping_sub(back + 1))
                        .is_some_and(|t| t == "(")
                        && tokens
                            .get(i.wrapping_sub(back + 2))
                            .is_some_and(|t| t == "pub")
                }));
        if !public {
            return;
        }
        let end = (i..tokens.len())
            .find(|&j| tokens[j] == ";")
            .unwrap_or(tokens.len());
        for (path, name) in use_tree(&tokens[i + 1..end]) {
            exports.push(Reexport {
                inline: inline.to_vec(),
                name,
                path,
            });
        }
    });
    exports
}

/// The leaves of a `use` tree: each full path and the name it brings in.
fn use_tree(tokens: &[String]) -> Vec<(Vec<String>, String)> {
    let mut leaves = Vec::new();
    let mut at = 0;
    use_subtree(tokens, &mut at, Vec::new(), &mut leaves);
    leaves
}

fn use_subtree(
    tokens: &[String],
    at: &mut usize,
    prefix: Vec<String>,
    leaves: &mut Vec<(Vec<String>, String)>,
) {
    let mut path = prefix;
    while *at < tokens.len() {
        let token = tokens[*at].clone();
        *at += 1;
        match token.as_str() {
            "::" => {}
            "{" => {
                loop {
                    use_subtree(tokens, at, path.clone(), leaves);
                    match tokens.get(*at).map(String::as_str) {
                        Some(",") => *at += 1,
                        Some("}") => {
                            *at += 1;
                            break;
                        }
                        _ => break,
                    }
                    if tokens.get(*at).is_some_and(|t| t == "}") {
                        *at += 1;
                        break;
                    }
                }
                return;
            }
            "," | "}" => {
                *at -= 1;
                break;
            }
            "as" => {
                let name = tokens.get(*at).cloned().unwrap_or_default();
                *at += 1;
                leaves.push((path, name));
                return;
            }
            "self" if !path.is_empty() => {}
            _ => path.push(token),
        }
    }
    if let Some(last) = path.last().cloned() {
        let name = if last == "self" {
            path.get(path.len().wrapping_sub(2))
                .cloned()
                .unwrap_or(last)
        } else {
            last
        };
        leaves.push((path, name));
    }
}

/// The cycles among the children of each folder, each told with the file
/// references that make it.
fn cycles(edges: &BTreeSet<Edge>, crate_: &Crate) -> Vec<String> {
    // Per folder: edges between its children, with the file edges behind.
    let mut folders: BTreeMap<ModPath, BTreeMap<(String, String), Vec<Edge>>> = BTreeMap::new();
    for edge in edges {
        let common = edge
            .from
            .iter()
            .zip(&edge.to)
            .take_while(|(a, b)| a == b)
            .count();
        let (Some(from), Some(to)) = (edge.from.get(common), edge.to.get(common)) else {
            continue; // a folder and what is in it
        };
        folders
            .entry(edge.from[..common].to_vec())
            .or_default()
            .entry((from.clone(), to.clone()))
            .or_default()
            .push(edge.clone());
    }
    let mut found = Vec::new();
    for (folder, children) in &folders {
        for component in strongly_connected(children.keys()) {
            let cycle = cycle_in(&component, children.keys());
            let mut why = Vec::new();
            for pair in cycle.windows(2) {
                for edge in &children[&(pair[0].clone(), pair[1].clone())] {
                    why.push(format!(
                        "{} -> {}",
                        crate_.file_name(&edge.from),
                        crate_.file_name(&edge.to)
                    ));
                }
            }
            let folder_name = if folder.is_empty() {
                "src/".to_owned()
            } else {
                format!("src/{}/", folder.join("/"))
            };
            let members: Vec<&str> = component.iter().map(String::as_str).collect();
            found.push(format!(
                "in {folder_name}: {} (because {}; all of {} depend on each other)",
                cycle.join(" -> "),
                why.join(", "),
                members.join(", ")
            ));
        }
    }
    found
}

impl Crate {
    fn file_name(&self, module: &ModPath) -> String {
        match self.names.get(module) {
            Some(name) => name.clone(),
            None if module.is_empty() => "lib.rs".to_owned(),
            None => format!("{}.rs", module.join("/")),
        }
    }
}

/// The strongly connected components of more than one node (Tarjan).
fn strongly_connected<'a>(
    edges: impl Iterator<Item = &'a (String, String)> + Clone,
) -> Vec<BTreeSet<String>> {
    let nodes: BTreeSet<&String> = edges.clone().flat_map(|(a, b)| [a, b]).collect();
    let next = |node: &String| -> Vec<String> {
        edges
            .clone()
            .filter(|(a, _)| a == node)
            .map(|(_, b)| b.clone())
            .collect()
    };
    // Reachability closure: small graphs, so simply: a and b are in one
    // component when each reaches the other.
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(node) = stack.pop() {
            for to in next(&node) {
                if seen.insert(to.clone()) {
                    stack.push(to);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|node| (*node, reach(node))).collect();
    let mut components: Vec<BTreeSet<String>> = Vec::new();
    for node in &nodes {
        if !reaches[node].contains(*node) || components.iter().any(|c| c.contains(*node)) {
            continue;
        }
        let component: BTreeSet<String> = nodes
            .iter()
            .filter(|other| reaches[node].contains(**other) && reaches[**other].contains(*node))
            .map(|other| (*other).clone())
            .collect();
        components.push(component);
    }
    components
}

/// One cycle through a component, from its first node back to it.
fn cycle_in<'a>(
    component: &BTreeSet<String>,
    edges: impl Iterator<Item = &'a (String, String)> + Clone,
) -> Vec<String> {
    let start = component.iter().next().unwrap().clone();
    // Breadth-first from `start` back to it, inside the component.
    let mut previous: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.clone()]);
    while let Some(node) = queue.pop_front() {
        for (_, to) in edges
            .clone()
            .filter(|(a, b)| *a == node && component.contains(b))
        {
            if *to == start {
                // start -> .. -> node, then back to start.
                let mut path = vec![node.clone()];
                while let Some(before) = previous.get(path.last().unwrap()) {
                    path.push(before.clone());
                }
                path.reverse();
                path.push(start.clone());
                return path;
            }
            if !previous.contains_key(to) && *to != start {
                previous.insert(to.clone(), node.clone());
                queue.push_back(to.clone());
            }
        }
    }
    vec![start]
}

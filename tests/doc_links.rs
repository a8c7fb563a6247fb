//! Every link in the Markdown documentation leads somewhere, on GitHub and
//! on docs.rs.
//!
//! - A relative link (`docs/design.md`, `attribute.md#tls`, `#arguments`)
//!   names a file that exists, and its `#anchor` a heading of that file
//!   (GitHub's anchors: lower case, spaces as `-`, punctuation dropped).
//! - A reference (`[text][label]`) has its label defined in the file.
//! - The files rustdoc shows (the README, the crate's front page, and the
//!   guide pages in `lock-runtime/src/guide/`) link to other files only by
//!   references that `guide/links.md` defines again for rustdoc (to an item
//!   path, `crate::guide::...`): a relative file link would be dead on
//!   docs.rs.
//!
//! - A link by the repository's address (`[repository]/blob/main/docs/design.md`,
//!   the `repository` of the workspace's Cargo.toml) names a file of this
//!   work tree, checked as a relative link is: that is how the files rustdoc
//!   shows reach what docs.rs does not carry.
//! - The files rustdoc shows name no repository-only file (`docs/*.md`,
//!   `tests/...`, `CONTRIBUTING.md`) but as the text of a link: a docs.rs
//!   reader can open the link, not the path.
//!
//! No network: links to other `http(s)://` addresses are not followed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One link found in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Link {
    /// `[text](target)`, or `![alt](target)`.
    Inline { line: usize, target: String },
    /// `[text][label]`.
    Reference { line: usize, label: String },
    /// `[label]: target`: its target is checked as an inline link's, but
    /// rustdoc reads `guide/links.md`'s definition first (see `Reference`).
    Definition { line: usize, target: String },
}

/// What a Markdown file holds: its links, the labels it defines (and to
/// what), and the anchors of its headings.
#[derive(Debug, Default)]
struct Page {
    links: Vec<Link>,
    definitions: BTreeMap<String, String>,
    anchors: BTreeSet<String>,
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, every character
/// but letters, digits, `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The text of a line outside its code spans (`` `[a](b)` `` is no link).
fn outside_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else if in_code {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

fn parse(text: &str) -> Page {
    let mut page = Page::default();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut fenced = false;
    for (index, raw) in text.lines().enumerate() {
        let line_number = index + 1;
        let trimmed = raw.trim_start();
        if trimmed.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if let Some(heading) = trimmed.strip_prefix('#') {
            let heading = heading.trim_start_matches('#');
            if heading.starts_with(' ') {
                let base = anchor(&heading.replace('`', ""));
                // GitHub numbers repeated headings: `x`, `x-1`, `x-2`.
                let count = seen.entry(base.clone()).or_insert(0);
                let id = if *count == 0 {
                    base.clone()
                } else {
                    format!("{base}-{count}")
                };
                *count += 1;
                page.anchors.insert(id);
                continue;
            }
        }
        // `[label]: target` (up to three spaces of indent).
        if raw.len() - trimmed.len() <= 3 && trimmed.starts_with('[') {
            if let Some(end) = trimmed.find("]:") {
                let label = &trimmed[1..end];
                if !label.contains(']') {
                    let target = trimmed[end + 2..].split_whitespace().next().unwrap_or("");
                    page.definitions
                        .entry(label.to_lowercase())
                        .or_insert_with(|| target.to_owned());
                    page.links.push(Link::Definition {
                        line: line_number,
                        target: target.to_owned(),
                    });
                    continue;
                }
            }
        }
        let line = outside_code_spans(raw);
        let bytes = line.as_bytes();
        let mut at = 0;
        while let Some(open) = line[at..].find('[').map(|i| at + i) {
            // The matching `]`, nesting allowed (`[`code`](x)` was blanked).
            let mut depth = 0;
            let mut close = None;
            for (i, &b) in bytes.iter().enumerate().skip(open) {
                match b {
                    b'[' => depth += 1,
                    b']' => {
                        depth -= 1;
                        if depth == 0 {
                            close = Some(i);
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let Some(close) = close else { break };
            let rest = &line[close + 1..];
            if let Some(after) = rest.strip_prefix('(') {
                if let Some(end) = after.find(')') {
                    let target = after[..end].split_whitespace().next().unwrap_or("");
                    page.links.push(Link::Inline {
                        line: line_number,
                        target: target.to_owned(),
                    });
                    at = close + 1 + end + 2;
                    continue;
                }
            } else if let Some(after) = rest.strip_prefix('[') {
                if let Some(end) = after.find(']') {
                    let label = if end == 0 {
                        // `[label][]`
                        line[open + 1..close].trim().to_owned()
                    } else {
                        after[..end].to_owned()
                    };
                    page.links.push(Link::Reference {
                        line: line_number,
                        label: label.to_lowercase(),
                    });
                    at = close + 1 + end + 2;
                    continue;
                }
            }
            at = open + 1;
        }
    }
    page
}

/// A link rustdoc resolves itself (an item path), or an address off this
/// repository: not checked here (rustdoc's `-D warnings` checks the first).
fn is_external_or_item(target: &str) -> bool {
    target.starts_with("http://")
        || target.starts_with("https://")
        || target.starts_with("mailto:")
        || target.contains("::")
        || target == "crate"
        || target.starts_with("crate#")
}

/// The workspace's `repository` address (`[workspace.package]`).
fn repository() -> String {
    let manifest = std::fs::read_to_string(workspace().join("Cargo.toml")).expect("Cargo.toml");
    manifest
        .lines()
        .find_map(|line| line.strip_prefix("repository = "))
        .map(|value| value.trim().trim_matches('"').to_owned())
        .expect("a repository address in the workspace's Cargo.toml")
}

/// `[repository]/blob/main/<path>` (or `tree/main`) as a path from the
/// workspace's root, with its `#fragment`; `None` for any other target.
fn in_repository(target: &str, repository: &str) -> Option<String> {
    let rest = target.strip_prefix(repository)?;
    rest.strip_prefix("/blob/main/")
        .or_else(|| rest.strip_prefix("/tree/main/"))
        .map(str::to_owned)
}

/// Mentions of repository-only files outside link text in a file rustdoc
/// shows: `docs/design.md`, `tests/x.rs`, `CONTRIBUTING.md` as plain text or
/// code. One line each, `file:line: mention`.
fn unreachable_mentions(shown: &str, text: &str) -> Vec<String> {
    const NAMES: [&str; 4] = [
        "docs/design.md",
        "docs/benchmarks.md",
        "CONTRIBUTING.md",
        "tests/",
    ];
    let mut found = Vec::new();
    let mut fenced = false;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        // Link definitions carry the address, not text.
        if fenced || (trimmed.starts_with('[') && trimmed.contains("]:")) {
            continue;
        }
        for name in NAMES {
            let mut from = 0;
            while let Some(at) = line[from..].find(name).map(|i| from + i) {
                from = at + name.len();
                // Inside a link's address: `(https://.../tests/x.rs)`.
                let before = &line[..at];
                let in_address = before
                    .rfind("](")
                    .is_some_and(|open| !before[open..].contains(')'));
                // Inside link text: an unclosed `[` before, and the `]` after
                // it followed by `(` or `[`.
                let in_text = before.rfind('[').is_some_and(|open| {
                    !before[open..].contains(']')
                        && line[at..].find(']').is_some_and(|close| {
                            matches!(line.as_bytes().get(at + close + 1), Some(b'(' | b'['))
                        })
                });
                if !in_address && !in_text {
                    found.push(format!(
                        "{shown}:{}: `{name}` named as text: a docs.rs reader cannot open it; \
                         link it by the repository's address",
                        index + 1
                    ));
                }
            }
        }
    }
    found
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the workspace")
        .to_path_buf()
}

fn markdown_in(directory: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(directory)
        .unwrap_or_else(|error| panic!("{}: {error}", directory.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    files.sort();
    files
}

/// Parses `path` into `pages` once; its canonical path.
fn read(pages: &mut BTreeMap<PathBuf, Page>, path: &Path) -> Option<PathBuf> {
    let canonical = path.canonicalize().ok()?;
    if !pages.contains_key(&canonical) {
        let text = std::fs::read_to_string(&canonical).ok()?;
        pages.insert(canonical.clone(), parse(&text));
    }
    Some(canonical)
}

/// Every problem with the links of `files`, one line each. `rustdoc_files`
/// are also shown by rustdoc, with `rustdoc_links`' definitions first.
fn problems(files: &[PathBuf], rustdoc_files: &[PathBuf], rustdoc_links: &Page) -> Vec<String> {
    let root = workspace();
    let repository = repository();
    let mut pages: BTreeMap<PathBuf, Page> = BTreeMap::new();
    for file in files {
        read(&mut pages, file).unwrap_or_else(|| panic!("{} is not readable", file.display()));
    }
    let mut problems = Vec::new();
    for file in files {
        let canonical = file.canonicalize().expect("read above");
        let shown = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        let in_rustdoc = rustdoc_files
            .iter()
            .any(|f| f.canonicalize().ok() == Some(canonical.clone()));
        if in_rustdoc {
            let text = std::fs::read_to_string(&canonical).expect("read above");
            problems.extend(unreachable_mentions(&shown, &text));
        }
        let links = pages[&canonical].links.clone();
        let definitions = pages[&canonical].definitions.clone();
        let own_anchors = pages[&canonical].anchors.clone();
        for link in links {
            let is_definition = matches!(link, Link::Definition { .. });
            match link {
                Link::Reference { line, label } => {
                    if !definitions.contains_key(&label) {
                        problems.push(format!("{shown}:{line}: `[{label}]` is not defined"));
                    }
                    if in_rustdoc {
                        match rustdoc_links.definitions.get(&label) {
                            Some(target) if is_external_or_item(target) => {}
                            Some(target) => problems.push(format!(
                                "{shown}:{line}: `[{label}]` is `{target}` in guide/links.md: \
                                 give rustdoc an item path (crate::guide::...)"
                            )),
                            None if definitions.get(&label).is_some_and(|target| {
                                is_external_or_item(target) || target.starts_with('#')
                            }) => {}
                            None => problems.push(format!(
                                "{shown}:{line}: `[{label}]` links to a file, dead on docs.rs: \
                                 define it in lock-runtime/src/guide/links.md too"
                            )),
                        }
                    }
                }
                Link::Inline { line, target } | Link::Definition { line, target } => {
                    let by_address = in_repository(&target, &repository);
                    if (by_address.is_none() && is_external_or_item(&target)) || target.is_empty() {
                        continue;
                    }
                    let target = by_address.clone().unwrap_or(target);
                    let (path, fragment) = match target.split_once('#') {
                        Some((path, fragment)) => (path, Some(fragment)),
                        None => (target.as_str(), None),
                    };
                    let anchors = if path.is_empty() {
                        own_anchors.clone()
                    } else {
                        if in_rustdoc && !is_definition && by_address.is_none() {
                            problems.push(format!(
                                "{shown}:{line}: `{target}` is a link to a file, dead on docs.rs: \
                                 write a reference defined in guide/links.md"
                            ));
                        }
                        let base = match by_address {
                            Some(_) => root.clone(),
                            None => canonical
                                .parent()
                                .expect("a file's directory")
                                .to_path_buf(),
                        };
                        let resolved = base.join(path);
                        if !resolved.exists() {
                            problems.push(format!("{shown}:{line}: `{target}`: no such file"));
                            continue;
                        }
                        if fragment.is_none() || resolved.extension().is_none_or(|ext| ext != "md")
                        {
                            continue;
                        }
                        match read(&mut pages, &resolved) {
                            Some(canonical) => pages[&canonical].anchors.clone(),
                            None => {
                                problems.push(format!("{shown}:{line}: `{target}`: unreadable"));
                                continue;
                            }
                        }
                    };
                    if let Some(fragment) = fragment {
                        if !anchors.contains(fragment) {
                            problems.push(format!(
                                "{shown}:{line}: `{target}`: no heading with the anchor `#{fragment}`"
                            ));
                        }
                    }
                }
            }
        }
    }
    problems
}

fn documentation() -> (Vec<PathBuf>, Vec<PathBuf>, Page) {
    let root = workspace();
    let guide = root.join("lock-runtime/src/guide");
    let mut rustdoc_files = vec![root.join("README.md")];
    rustdoc_files.extend(
        markdown_in(&guide)
            .into_iter()
            .filter(|path| !path.ends_with("links.md")),
    );
    let mut files = rustdoc_files.clone();
    files.push(root.join("CONTRIBUTING.md"));
    files.extend(markdown_in(&root.join("docs")));
    let links = parse(&std::fs::read_to_string(guide.join("links.md")).expect("guide/links.md"));
    (files, rustdoc_files, links)
}

#[test]
fn every_documentation_link_leads_somewhere() {
    let (files, rustdoc_files, links) = documentation();
    let problems = problems(&files, &rustdoc_files, &links);
    assert!(problems.is_empty(), "dead links:\n{}", problems.join("\n"));
}

#[test]
fn rustdoc_link_definitions_name_existing_pages() {
    // The items themselves are checked by `cargo doc` with `-D warnings`;
    // here, that every guide page they name has its file.
    let (_, _, links) = documentation();
    let guide = workspace().join("lock-runtime/src/guide");
    for target in links.definitions.values() {
        if let Some(page) = target.strip_prefix("crate::guide::") {
            let page = page.split('#').next().unwrap_or(page);
            assert!(
                guide.join(format!("{page}.md")).exists(),
                "guide/links.md names `{target}`, but there is no guide/{page}.md"
            );
        }
    }
}

/// The checker itself: it finds what it is for.
#[test]
fn the_checker_finds_dead_links() {
    let directory = std::env::temp_dir().join(format!("doc-links-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let page = directory.join("page.md");
    let other = directory.join("other.md");
    let links = directory.join("links.md");
    std::fs::write(&other, "# Other page\n\n## Some `code` section\n").unwrap();
    std::fs::write(
        &page,
        "# Page\n\n\
         [ok](other.md) [ok](other.md#some-code-section) [ok](#page) [ok](https://x.y/z)\n\
         `[not a link](nowhere.md)` [ok][known] [item](crate::Lock)\n\
         ```\n[in a code block](nowhere.md)\n```\n\
         [dead](missing.md) [bad anchor](other.md#nothing) [bad self](#nothing) [undefined][nope]\n\
         \n[known]: other.md\n",
    )
    .unwrap();
    std::fs::write(&links, "[known]: crate::guide::other\n").unwrap();
    let rustdoc_links = parse(&std::fs::read_to_string(&links).unwrap());
    let found = problems(std::slice::from_ref(&page), &[], &rustdoc_links);
    let expected = [
        "`missing.md`: no such file",
        "`other.md#nothing`: no heading",
        "`#nothing`: no heading",
        "`[nope]` is not defined",
    ];
    assert_eq!(found.len(), expected.len(), "{found:#?}");
    for (problem, expected) in found.iter().zip(expected) {
        assert!(problem.contains(expected), "{problem} / {expected}");
    }
    // Shown by rustdoc: a relative file link is dead there, a reference
    // defined in links.md is not.
    let found = problems(
        std::slice::from_ref(&other),
        std::slice::from_ref(&other),
        &rustdoc_links,
    );
    assert!(found.is_empty(), "{found:#?}");
    std::fs::write(
        &other,
        "# Other\n\n[file](page.md) [known][known]\n\n[known]: page.md\n",
    )
    .unwrap();
    let found = problems(
        std::slice::from_ref(&other),
        std::slice::from_ref(&other),
        &rustdoc_links,
    );
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].contains("dead on docs.rs"), "{found:#?}");
    std::fs::remove_dir_all(&directory).unwrap();
}

/// The crate's front page (`lock-runtime/README.md`, which the package
/// carries and `src/lib.rs` includes) is the repository's README.
#[test]
fn the_crate_front_page_is_the_readme() {
    let root = workspace();
    let front = root.join("lock-runtime/README.md");
    assert_eq!(
        std::fs::read_to_string(&front).expect("lock-runtime/README.md"),
        std::fs::read_to_string(root.join("README.md")).expect("README.md"),
        "lock-runtime/README.md must be the repository's README.md (a link to it)"
    );
}

/// Repository-only files named as text in a page rustdoc shows, and links
/// by the repository's address to files that do not exist, are found.
#[test]
fn the_checker_finds_unreachable_mentions_and_dead_addresses() {
    let repository = repository();
    let found = unreachable_mentions(
        "page.md",
        &format!(
            "see `docs/design.md` §2 and tests/acl.rs\n\
             [`docs/design.md`]({repository}/blob/main/docs/design.md) §2\n\
             [the design][design] and [`tests/ui/`]({repository}/tree/main/tests/ui/)\n\
             ```\ntests/in_code.rs\n```\n\
             [design]: {repository}/blob/main/docs/design.md\n"
        ),
    );
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found[0].contains("page.md:1: `docs/design.md`"),
        "{found:#?}"
    );
    assert!(found[1].contains("page.md:1: `tests/`"), "{found:#?}");

    let directory = std::env::temp_dir().join(format!("doc-addresses-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let page = directory.join("page.md");
    std::fs::write(
        &page,
        format!(
            "# Page\n\n[ok]({repository}/blob/main/docs/design.md#2-redis-operations) \
             [dead]({repository}/blob/main/docs/nothing.md) \
             [bad anchor]({repository}/blob/main/docs/design.md#nothing)\n"
        ),
    )
    .unwrap();
    let found = problems(std::slice::from_ref(&page), &[], &Page::default());
    std::fs::remove_dir_all(&directory).unwrap();
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found[0].contains("docs/nothing.md`: no such file"),
        "{found:#?}"
    );
    assert!(
        found[1].contains("no heading with the anchor `#nothing`"),
        "{found:#?}"
    );
}

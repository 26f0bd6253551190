//! The manual's links hold: every relative link in the book (docs/src), README.md, ARCHITECTURE.md and the
//! chart's README names a file that exists and, with a `#fragment`, a heading of that file; and every page
//! under docs/src is in SUMMARY.md, so none is left out of the book. No cluster needed.

use std::{
    collections::HashSet,
    fs,
    path::{Path, PathBuf},
};

use testkit::repo_root;

fn pages(dir: &Path) -> Vec<PathBuf> {
    testkit::files_under(dir, "md")
}

/// The lines of a Markdown text outside fenced code blocks, with their numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fenced = !fenced;
        } else if !fenced {
            lines.push((n + 1, line));
        }
    }
    lines
}

/// A line without its code spans, whose text is code, not links.
fn without_code(line: &str) -> String {
    line.split('`').step_by(2).collect::<Vec<_>>().join(" ")
}

/// The targets of the inline links (`[text](target)`, images too) and reference definitions
/// (`[label]: target`) of a text, with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in prose(text) {
        let line = without_code(line);
        let mut rest = line.as_str();
        while let Some(start) = rest.find("](") {
            rest = &rest[start + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            // A title after the target (`(file.md "Title")`) is not part of it.
            let target = rest[..end].split_whitespace().next().unwrap_or_default();
            found.push((n, target.trim_matches(['<', '>']).to_string()));
        }
        let trimmed = line.trim_start();
        if let Some(definition) = trimmed.strip_prefix('[').and_then(|l| l.split_once("]: ")) {
            found.push((n, definition.1.split_whitespace().next().unwrap_or_default().to_string()));
        }
    }
    found
}

/// The id mdBook 0.5 gives a heading (mdbook-html's `id_from_content`): its text lowercased, letters,
/// digits, `_` and `-` kept, whitespace made `-`, anything else dropped.
fn heading_id(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c),
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

/// The text a heading's Markdown shows: code spans as their code, links as their text.
fn heading_text(markdown: &str) -> String {
    let mut text = markdown.replace('`', "");
    while let (Some(open), Some(close)) = (text.find("]("), text.find(')')) {
        if close < open {
            break;
        }
        text.replace_range(open..=close, "");
        text = text.replacen('[', "", 1);
    }
    text
}

/// The fragment ids of a page's headings, repeated ones suffixed `-1`, `-2` as mdBook does.
fn anchors(text: &str) -> HashSet<String> {
    let mut ids = HashSet::new();
    for (_, line) in prose(text) {
        let Some(heading) = line.strip_prefix('#') else { continue };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let id = heading_id(&heading_text(heading.trim_end_matches('#')));
        let mut unique = id.clone();
        let mut counter = 0;
        while !ids.insert(unique.clone()) {
            counter += 1;
            unique = format!("{id}-{counter}");
        }
    }
    ids
}

/// The links of `page` that do not resolve, each as `page:line: target: why`.
fn broken_links(page: &Path, text: &str) -> Vec<String> {
    let mut broken = Vec::new();
    for (line, target) in links(text) {
        if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (file, fragment) = target.split_once('#').map_or((target.as_str(), None), |(f, a)| (f, Some(a)));
        let resolved = if file.is_empty() { page.to_path_buf() } else { page.with_file_name("").join(file) };
        let why = if !resolved.exists() {
            Some(format!("{} does not exist", resolved.display()))
        } else {
            fragment.filter(|_| resolved.extension().is_some_and(|e| e == "md")).and_then(|fragment| {
                let target_text = if file.is_empty() {
                    text.to_string()
                } else {
                    fs::read_to_string(&resolved).unwrap_or_default()
                };
                (!anchors(&target_text).contains(fragment)).then(|| format!("no heading #{fragment} there"))
            })
        };
        if let Some(why) = why {
            broken.push(format!("{}:{line}: {target}: {why}", page.display()));
        }
    }
    broken
}

fn checked_pages() -> Vec<PathBuf> {
    let mut checked = pages(&repo_root().join("docs/src"));
    for page in ["README.md", "ARCHITECTURE.md", "charts/fleetroll/README.md"] {
        checked.push(repo_root().join(page));
    }
    checked
}

#[test]
fn every_relative_link_of_the_manual_resolves() {
    let mut broken = Vec::new();
    let mut count = 0;
    for page in checked_pages() {
        let text = fs::read_to_string(&page).unwrap_or_else(|e| panic!("read {}: {e}", page.display()));
        count += links(&text).len();
        broken.extend(broken_links(&page, &text));
    }
    assert!(count > 100, "the pages have links to check ({count} found)");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_page_of_the_manual_is_in_its_summary() {
    let src = repo_root().join("docs/src");
    let summary = fs::read_to_string(src.join("SUMMARY.md")).expect("docs/src/SUMMARY.md");
    let listed: HashSet<PathBuf> = links(&summary).into_iter().map(|(_, target)| src.join(target)).collect();
    let missing: Vec<_> = pages(&src)
        .into_iter()
        .filter(|page| !page.ends_with("SUMMARY.md") && !listed.contains(page))
        .map(|page| page.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "pages SUMMARY.md does not list (so the book leaves them out):\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_check_finds_broken_links_and_follows_mdbook_ids() {
    // A check that can never fail proves nothing.
    let page = repo_root().join("docs/src/introduction.md");
    let text = "# A `code` heading: (with) punctuation\n## Twice\n## Twice\n\
                [ok](#a-code-heading-with-punctuation) [ok](#twice-1) [ok](getting-started.md)\n\
                [bad](#twice-2) [bad](missing.md) [bad](how-it-works.md#no-such-heading)\n\
                ```\n[in a code block](missing.md)\n```\n`[in a code span](missing.md)`\n";
    let broken = broken_links(&page, text);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(
        broken[0].contains("#twice-2")
            && broken[1].contains("missing.md")
            && broken[2].contains("#no-such-heading")
    );
    assert_eq!(heading_id("Über `--passes`: add more_passes"), "über---passes-add-more_passes");
}

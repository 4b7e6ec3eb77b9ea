//! `--record`: the run's block goes into BENCHMARKS.md, newest first, right
//! after the file's introduction (everything before its first `## ` entry).

use std::path::Path;

use anyhow::Context;

/// `document` with `entry` placed before its first `## ` heading, or at its
/// end when it has none yet; entries are separated by one blank line.
pub fn insert_entry(document: &str, entry: &str) -> String {
    let entry = format!("{}\n", entry.trim_end());
    let mut offset = 0;
    for line in document.split_inclusive('\n') {
        if line.starts_with("## ") {
            return format!("{}{entry}\n{}", &document[..offset], &document[offset..]);
        }
        offset += line.len();
    }
    let intro = document.trim_end();
    if intro.is_empty() {
        entry
    } else {
        format!("{intro}\n\n{entry}")
    }
}

/// Inserts `entry` into the file at `path`.
pub(crate) fn record(path: &Path, entry: &str) -> anyhow::Result<()> {
    let document =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    std::fs::write(path, insert_entry(&document, entry))
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_entries_go_above_older_ones() {
        let document = "# Benchmarks\n\nIntro.\n\n## 2026-11-30 — old\n\n| a |\n";
        let entry = "## 2026-12-01 — suite: rest\n\n| b |\n\n";
        assert_eq!(
            insert_entry(document, entry),
            "# Benchmarks\n\nIntro.\n\n## 2026-12-01 — suite: rest\n\n| b |\n\n## 2026-11-30 — old\n\n| a |\n"
        );
        // A `## ` inside a line is no heading.
        let document = "# B\n\nsee ## here\n";
        assert_eq!(
            insert_entry(document, "## new\n"),
            "# B\n\nsee ## here\n\n## new\n"
        );
        assert_eq!(insert_entry("", "## new"), "## new\n");
    }
}

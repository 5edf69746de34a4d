//! Name globs for tool names and agent names.
//!
//! `*` matches any run of characters (`/` and `.` included, so MCP-style prefixes work),
//! `?` one character, `[abc]` / `[a-z]` / `[!a]` one of a set, `{a,b}` either alternative, and
//! `\` escapes the next character. Matching is case-sensitive and covers the whole name.

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};

/// One glob, checked when the policy loads.
pub(crate) fn compile(pattern: &str) -> Result<Glob, String> {
    if pattern.is_empty() {
        return Err("empty glob: it would match nothing; write '*' to match every name".to_owned());
    }
    GlobBuilder::new(pattern)
        .literal_separator(false)
        .backslash_escape(true)
        .empty_alternates(false)
        .build()
        .map_err(|e| format!("invalid glob '{pattern}': {}", e.kind()))
}

/// Whether `pattern` (checked by [`compile`] when it was accepted) matches `name`; a pattern that
/// does not compile matches nothing.
pub(crate) fn matches(pattern: &str, name: &str) -> bool {
    compile(pattern).is_ok_and(|glob| glob.compile_matcher().is_match(name))
}

/// A non-empty list of globs that remembers which entry matched.
#[derive(Clone, Debug)]
pub(crate) struct GlobList {
    patterns: Vec<String>,
    set: GlobSet,
}

impl GlobList {
    /// Builds the list; every glob was compiled by [`compile`] already.
    pub(crate) fn new(globs: Vec<Glob>) -> Result<Self, String> {
        let mut builder = GlobSetBuilder::new();
        let patterns = globs.iter().map(|g| g.glob().to_owned()).collect();
        for glob in globs {
            builder.add(glob);
        }
        let set = builder.build().map_err(|e| format!("invalid glob list: {e}"))?;
        Ok(GlobList { patterns, set })
    }

    /// Whether any entry matches `name`.
    pub(crate) fn is_match(&self, name: &str) -> bool {
        self.set.is_match(name)
    }

    /// The first entry (in list order) that matches `name`.
    pub(crate) fn first_match(&self, name: &str) -> Option<&str> {
        let first = self.set.matches(name).into_iter().min()?;
        Some(&self.patterns[first])
    }

    /// The entries as written, joined for messages.
    pub(crate) fn describe(&self) -> String {
        self.patterns.join(", ")
    }
}

//! The page of the policy file, `docs/reference/policy-file.md`: every key the parser accepts,
//! rendered from the table it checks keys against (`kernel/src/policy/keys.rs`), and an example
//! file the tests load with the real parser.

use std::fmt::Write as _;

use crate::clap_reference::cell;
use crate::policy::keys::{EXAMPLE, Section};

/// The page, after its `generated_by` line.
pub(super) fn page(generated_by: String) -> String {
    let mut out = generated_by;
    out.push_str("# The policy file\n\n");
    out.push_str(
        "Every key of the YAML file `kernel --policy FILE` reads (again on SIGHUP and through \
         `AdminService.ReloadPolicy`). [Governance](../guides/governance.md) says how its presets, its rules and a \
         tool's own `requires_approval` combine: the strictest answer wins, deny over approve over allow. A file \
         with any error is refused whole, naming its line and what is wrong; so is a key this page does not \
         list.\n\n\
         A glob matches a whole name, case-sensitively: `*` any run of characters (`/` and `.` included), `?` one \
         character, `[abc]`, `[a-z]` or `[!a]` one of a set, `{a,b}` either alternative, `\\` escapes the next \
         character. A list (of globs or risk levels) must not be empty: remove the key instead.\n\n",
    );
    out.push_str("## Example\n\n```yaml\n");
    out.push_str(EXAMPLE);
    out.push_str("```\n\n");
    for section in Section::ALL {
        render_section(&mut out, section);
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

/// The heading of a section and the table of its keys.
fn render_section(out: &mut String, section: Section) {
    match section {
        Section::File => out.push_str("## The top level\n\n"),
        other => {
            let _ = writeln!(out, "## `{}`\n", other.path());
        }
    }
    out.push_str("| key | takes | if absent | meaning | example |\n|---|---|---|---|---|\n");
    for key in section.keys() {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | `{}` |",
            key.name,
            cell(key.value),
            cell(key.default),
            cell(key.meaning),
            cell(key.example)
        );
    }
    out.push('\n');
}

/// The ```yaml block of `page`'s text.
pub(super) fn yaml_block(page: &str) -> Option<&str> {
    let start = page.find("```yaml\n")? + "```yaml\n".len();
    let end = start + page[start..].find("```")?;
    Some(&page[start..end])
}

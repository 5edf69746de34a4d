//! A posted form's fields, and the page that asks to confirm what a form would do before it is
//! done (sending the same fields again, confirmed): what every acting form of the console uses.

use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use super::{Section, layout};

/// The fields of a posted form.
pub struct Sent(Vec<(String, String)>);

impl From<Vec<(String, String)>> for Sent {
    fn from(fields: Vec<(String, String)>) -> Sent {
        Sent(fields)
    }
}

impl Sent {
    pub fn fields(&self) -> &[(String, String)] {
        &self.0
    }

    pub fn get(&self, name: &str) -> &str {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map_or("", |(_, value)| value.as_str())
    }

    pub fn confirmed(&self) -> bool {
        self.get("confirmed") == "yes"
    }
}

/// A field the confirmation page still lets the visitor fill in: its name, and its markup.
pub type Editable<'a> = Option<(&'a str, Markup)>;

/// The page that asks before doing: what will happen, and a form sending `sent` again, confirmed,
/// with the `editable` field as the visitor leaves it.
pub fn confirm(
    title: &str,
    what: Markup,
    (action, back): (&str, &str),
    (sent, editable): (&Sent, Editable<'_>),
    signed_in: bool,
) -> Response {
    let (edited, field) = editable.map_or(("", None), |(name, markup)| (name, Some(markup)));
    let body = html! {
        h1 { (title) }
        div.confirm { (what) }
        form.confirm method="post" action=(action) {
            @for (name, value) in sent.0.iter().filter(|(name, _)| name != "confirmed" && name != edited) {
                input type="hidden" name=(name) value=(value);
            }
            @if let Some(field) = field { (field) }
            input type="hidden" name="confirmed" value="yes";
            button.danger type="submit" { "Yes, " (title.to_lowercase()) }
            " "
            a href=(back) { "No, go back" }
        }
    };
    layout(title, Section::Runs, signed_in, body).into_response()
}

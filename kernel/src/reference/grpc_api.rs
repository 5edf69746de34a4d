//! The page of the gRPC API, `docs/reference/grpc-api.md`: every service, RPC, message and enum
//! of `proto/kernel/v1/*.proto`, with the protos' own comments, read from the descriptor set the
//! proto crate compiles (protox keeps the comments in its source info).

use std::collections::HashMap;
use std::fmt::Write as _;

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{
    DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorProto, FileDescriptorSet,
    ServiceDescriptorProto,
};

use crate::clap_reference::cell;

/// The package whose files the page covers; imports such as `google/protobuf` are left out.
const PACKAGE: &str = "kernel.v1";

// Field numbers of descriptor.proto, the steps of a source-info path.
const FILE_MESSAGE: i32 = 4;
const FILE_ENUM: i32 = 5;
const FILE_SERVICE: i32 = 6;
const MESSAGE_FIELD: i32 = 2;
const MESSAGE_NESTED: i32 = 3;
const MESSAGE_ENUM: i32 = 4;
const ENUM_VALUE: i32 = 2;
const SERVICE_METHOD: i32 = 2;

/// The comments of one file, by source-info path, and the line each declaration starts on.
struct Comments {
    text: HashMap<Vec<i32>, String>,
    line: HashMap<Vec<i32>, i32>,
}

impl Comments {
    fn of(file: &FileDescriptorProto) -> Comments {
        let mut comments = Comments {
            text: HashMap::new(),
            line: HashMap::new(),
        };
        let locations = file.source_code_info.iter().flat_map(|info| &info.location);
        for location in locations {
            if let Some(line) = location.span.first() {
                comments.line.entry(location.path.clone()).or_insert(*line);
            }
            // The comment above a declaration, else the one after it on its line.
            let text = location.leading_comments().trim();
            let text = if text.is_empty() {
                location.trailing_comments().trim()
            } else {
                text
            };
            if !text.is_empty() {
                comments.text.insert(location.path.clone(), markdown(&cell(text)));
            }
        }
        comments
    }

    /// The comment at `path`, as one table cell or paragraph; empty where the proto has none.
    fn at(&self, path: &[i32]) -> &str {
        self.text.get(path).map(String::as_str).unwrap_or("")
    }
}

/// `text` with `<` and `>` outside code spans escaped: the comments write placeholders such as
/// `cancelled: <reason>`, which Markdown would take for HTML and hide.
fn markdown(text: &str) -> String {
    let mut out = String::new();
    for (index, part) in text.split('`').enumerate() {
        if index > 0 {
            out.push('`');
        }
        if index % 2 == 0 {
            out.push_str(&part.replace('<', "&lt;").replace('>', "&gt;"));
        } else {
            out.push_str(part);
        }
    }
    out
}

/// The descriptor set of the protocol, as the proto crate's build compiled it.
fn descriptors() -> FileDescriptorSet {
    let set = FileDescriptorSet::decode(kernel_proto::FILE_DESCRIPTOR_SET).expect("the descriptor set");
    let kept_comments = set.file.iter().any(|file| file.source_code_info.is_some());
    assert!(
        kept_comments,
        "the descriptor set has no source info: compile the protos with it"
    );
    set
}

/// The files of [`PACKAGE`], in the order the proto crate compiles them.
fn files(set: &FileDescriptorSet) -> Vec<&FileDescriptorProto> {
    set.file.iter().filter(|file| file.package() == PACKAGE).collect()
}

/// The anchor GitHub gives a heading of one word, such as a message's name.
fn anchor(name: &str) -> String {
    name.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
        .collect()
}

/// A message or enum of the package as a link to its heading; another as its full name.
fn type_link(type_name: &str) -> String {
    let name = type_name.trim_start_matches('.');
    match name.strip_prefix(&format!("{PACKAGE}.")) {
        Some(local) => format!("[`{local}`](#{})", anchor(local)),
        None => format!("`{name}`"),
    }
}

/// The page: an index of services, each service's RPCs, then each file's messages and enums.
pub(super) fn page(generated_by: String) -> String {
    let set = descriptors();
    let files = files(&set);
    let mut out = generated_by;
    out.push_str("# The gRPC API\n\n");
    let _ = writeln!(
        out,
        "Every service, RPC, message and enum of the package `{PACKAGE}` (`proto/kernel/v1/*.proto`), with the \
         protos' own comments; where a proto has no comment the cell is empty. The kernel serves them on \
         `--listen`, with gRPC server reflection and health. A type links to its table.\n"
    );
    out.push_str("## Services\n\n");
    for file in &files {
        let comments = Comments::of(file);
        for (index, service) in file.service.iter().enumerate() {
            let _ = writeln!(
                out,
                "- [`{}`](#{}) ({}): {}",
                service.name(),
                anchor(service.name()),
                file_name(file),
                comments.at(&[FILE_SERVICE, index as i32])
            );
        }
    }
    out.push('\n');
    for file in &files {
        let comments = Comments::of(file);
        for (index, service) in file.service.iter().enumerate() {
            render_service(&mut out, service, &comments, &[FILE_SERVICE, index as i32]);
        }
    }
    for file in &files {
        render_types(&mut out, file);
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

/// `runs.proto`, from `kernel/v1/runs.proto`.
fn file_name(file: &FileDescriptorProto) -> &str {
    file.name().rsplit('/').next().unwrap_or(file.name())
}

fn render_service(out: &mut String, service: &ServiceDescriptorProto, comments: &Comments, path: &[i32]) {
    let _ = writeln!(out, "## {}\n", service.name());
    paragraph(out, comments.at(path));
    out.push_str("| RPC | request | response | what it does |\n|---|---|---|---|\n");
    for (index, method) in service.method.iter().enumerate() {
        let stream = |streaming: bool| if streaming { "stream " } else { "" };
        let _ = writeln!(
            out,
            "| `{}` | {}{} | {}{} | {} |",
            method.name(),
            stream(method.client_streaming()),
            type_link(method.input_type()),
            stream(method.server_streaming()),
            type_link(method.output_type()),
            comments.at(&[path, &[SERVICE_METHOD, index as i32]].concat())
        );
    }
    out.push('\n');
}

/// A file's messages and enums, in the order they are declared.
fn render_types(out: &mut String, file: &FileDescriptorProto) {
    let comments = Comments::of(file);
    let _ = writeln!(out, "## Messages and enums of {}\n", file_name(file));
    let mut declared: Vec<(i32, Vec<i32>)> = Vec::new();
    for (kind, count) in [
        (FILE_MESSAGE, file.message_type.len()),
        (FILE_ENUM, file.enum_type.len()),
    ] {
        for index in 0..count as i32 {
            let path = vec![kind, index];
            declared.push((comments.line.get(&path).copied().unwrap_or(i32::MAX), path));
        }
    }
    declared.sort();
    for (_, path) in declared {
        let index = path[1] as usize;
        if path[0] == FILE_MESSAGE {
            render_message(out, &file.message_type[index], "", &comments, &path);
        } else {
            render_enum(out, &file.enum_type[index], "", &comments, &path);
        }
    }
}

/// A message's heading, comment and table of fields, then its nested messages and enums.
fn render_message(out: &mut String, message: &DescriptorProto, outer: &str, comments: &Comments, path: &[i32]) {
    let name = format!("{outer}{}", message.name());
    let _ = writeln!(out, "### {name}\n");
    paragraph(out, comments.at(path));
    if message.field.is_empty() {
        out.push_str("No fields.\n\n");
    } else {
        out.push_str("| field | number | type | label | meaning |\n|---|---|---|---|---|\n");
        for (index, field) in message.field.iter().enumerate() {
            let (kind, label) = field_type(message, field);
            let _ = writeln!(
                out,
                "| `{}` | {} | {kind} | {label} | {} |",
                field.name(),
                field.number(),
                comments.at(&[path, &[MESSAGE_FIELD, index as i32]].concat())
            );
        }
        out.push('\n');
    }
    for (index, nested) in message.nested_type.iter().enumerate() {
        if !is_map_entry(nested) {
            let nested_path = [path, &[MESSAGE_NESTED, index as i32]].concat();
            render_message(out, nested, &format!("{name}."), comments, &nested_path);
        }
    }
    for (index, nested) in message.enum_type.iter().enumerate() {
        let nested_path = [path, &[MESSAGE_ENUM, index as i32]].concat();
        render_enum(out, nested, &format!("{name}."), comments, &nested_path);
    }
}

fn is_map_entry(message: &DescriptorProto) -> bool {
    message.options.as_ref().is_some_and(|options| options.map_entry())
}

/// A field's type as written in the proto (`map<string, string>` for a map) and its label:
/// `repeated`, `optional`, or the oneof it belongs to.
fn field_type(message: &DescriptorProto, field: &FieldDescriptorProto) -> (String, String) {
    let entry = message
        .nested_type
        .iter()
        .filter(|nested| is_map_entry(nested))
        .find(|nested| {
            field
                .type_name()
                .ends_with(&format!(".{}.{}", message.name(), nested.name()))
        });
    if let Some(entry) = entry {
        // A map of scalars reads as the proto writes it; a message or enum value gets its link.
        let (key, value) = (&entry.field[0], &entry.field[1]);
        let shown = match value.r#type() {
            Type::Message | Type::Enum => format!("map from {} to {}", scalar_or_link(key), scalar_or_link(value)),
            _ => format!("`map<{}, {}>`", scalar_name(key), scalar_name(value)),
        };
        return (shown, String::new());
    }
    let label = if field.proto3_optional() {
        "optional".to_owned()
    } else if let Some(oneof) = field.oneof_index {
        format!("oneof `{}`", message.oneof_decl[oneof as usize].name())
    } else if field.label() == Label::Repeated {
        "repeated".to_owned()
    } else {
        String::new()
    };
    (scalar_or_link(field), label)
}

/// A scalar type as the proto writes it (`string`, `uint64`), or a link to a message or enum.
fn scalar_or_link(field: &FieldDescriptorProto) -> String {
    match field.r#type() {
        Type::Message | Type::Enum | Type::Group => type_link(field.type_name()),
        _ => format!("`{}`", scalar_name(field)),
    }
}

/// A scalar field's type as the proto writes it: `string`, `uint64`.
fn scalar_name(field: &FieldDescriptorProto) -> String {
    field.r#type().as_str_name().trim_start_matches("TYPE_").to_lowercase()
}

fn render_enum(out: &mut String, kind: &EnumDescriptorProto, outer: &str, comments: &Comments, path: &[i32]) {
    // The heading is the bare name, the anchor every link to the enum uses; the table says enum.
    let _ = writeln!(out, "### {outer}{}\n", kind.name());
    paragraph(out, comments.at(path));
    out.push_str("| enum value | number | meaning |\n|---|---|---|\n");
    for (index, value) in kind.value.iter().enumerate() {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} |",
            value.name(),
            value.number(),
            comments.at(&[path, &[ENUM_VALUE, index as i32]].concat())
        );
    }
    out.push('\n');
}

/// `text` and a blank line; nothing where there is no text.
fn paragraph(out: &mut String, text: &str) {
    if !text.is_empty() {
        let _ = writeln!(out, "{text}\n");
    }
}

/// What lacks a comment: each RPC, message and enum by name (fields and values are left out:
/// many say all by their name).
pub(super) fn uncommented() -> Vec<String> {
    let set = descriptors();
    let mut missing = Vec::new();
    for file in files(&set) {
        let comments = Comments::of(file);
        for (s, service) in file.service.iter().enumerate() {
            if comments.at(&[FILE_SERVICE, s as i32]).is_empty() {
                missing.push(format!("service {}", service.name()));
            }
            for (m, method) in service.method.iter().enumerate() {
                if comments
                    .at(&[FILE_SERVICE, s as i32, SERVICE_METHOD, m as i32])
                    .is_empty()
                {
                    missing.push(format!("rpc {}.{}", service.name(), method.name()));
                }
            }
        }
        for (m, message) in file.message_type.iter().enumerate() {
            if comments.at(&[FILE_MESSAGE, m as i32]).is_empty() {
                missing.push(format!("message {} ({})", message.name(), file_name(file)));
            }
        }
        for (e, kind) in file.enum_type.iter().enumerate() {
            if comments.at(&[FILE_ENUM, e as i32]).is_empty() {
                missing.push(format!("enum {} ({})", kind.name(), file_name(file)));
            }
        }
    }
    missing
}

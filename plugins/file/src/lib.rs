//! `file` (content type 3): an uploaded file, by URL, with its name, size and mime type.

use courier_plugin_sdk::{
    Context, Delivery, Example, Manifest, Plugin, Rejection, Sender, check, export_plugin,
};
use serde::{Deserialize, Serialize};

const MAX_BYTES: u64 = 2 * 1024 * 1024 * 1024;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File {
    url: String,
    name: String,
    mime: String,
    size: u64,
}

struct FileKind;

impl Plugin for FileKind {
    type Payload = File;

    fn manifest() -> Manifest {
        Manifest {
            name: "file",
            version: env!("CARGO_PKG_VERSION"),
            content_type: 3,
            delivery: Delivery::Persistent,
            counts_unread: true,
            conversation_types: &[1, 2, 3],
            sender: Sender::User,
            max_payload_bytes: 4 * 1024,
            description: "A file by https URL with its name, mime type and size (up to 2 GiB)",
        }
    }

    fn validate(_ctx: &Context, p: File) -> Result<File, Rejection> {
        check::https_url("url", &p.url)?;
        let name = check::text("name", &p.name, 255)?;
        if name.contains(['/', '\\', '\n', '\t']) || name == "." || name == ".." {
            return Err(Rejection::new(
                "bad_name",
                "name must be a plain file name without slashes",
            ));
        }
        let mime = check::mime("mime", &p.mime, &[])?;
        check::range("size", p.size, 1, MAX_BYTES)?;
        Ok(File {
            url: p.url,
            name,
            mime,
            size: p.size,
        })
    }

    fn preview(p: &File) -> String {
        format!("[file] {}", p.name)
    }

    fn examples() -> Vec<Example> {
        vec![
            Example::accept(
                "pdf",
                1,
                r#"{"url":"https://files.example.com/x/report.pdf","name":"report.pdf","mime":"application/pdf","size":52311}"#,
            ),
            Example::accept(
                "odd-mime-case",
                2,
                r#"{"url":"https://files.example.com/x/a.zip","name":" a.zip ","mime":"Application/ZIP","size":1}"#,
            ),
            Example::reject(
                "path-in-name",
                1,
                r#"{"url":"https://files.example.com/x","name":"../etc/passwd","mime":"text/plain","size":1}"#,
            ),
            Example::reject(
                "too-large",
                1,
                r#"{"url":"https://files.example.com/x","name":"a.iso","mime":"application/octet-stream","size":3000000000}"#,
            ),
            Example::reject(
                "bad-mime",
                1,
                r#"{"url":"https://files.example.com/x","name":"a","mime":"pdf","size":1}"#,
            ),
            Example::reject(
                "javascript-url",
                1,
                r#"{"url":"javascript:alert(1)","name":"a","mime":"text/plain","size":1}"#,
            ),
        ]
    }
}

export_plugin!(FileKind);

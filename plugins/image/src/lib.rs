//! `image` (content type 2): an uploaded picture, by URL, with its size and a thumbnail.

use courier_plugin_sdk::{
    Context, Delivery, Example, Manifest, Plugin, Rejection, Sender, check, export_plugin,
};
use serde::{Deserialize, Serialize};

const MAX_SIDE: u64 = 20_000;
const MAX_BYTES: u64 = 50 * 1024 * 1024;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Thumbnail {
    url: String,
    width: u64,
    height: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Image {
    url: String,
    mime: String,
    width: u64,
    height: u64,
    size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    thumbnail: Option<Thumbnail>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    caption: String,
}

struct ImageKind;

impl Plugin for ImageKind {
    type Payload = Image;

    fn manifest() -> Manifest {
        Manifest {
            name: "image",
            version: env!("CARGO_PKG_VERSION"),
            content_type: 2,
            delivery: Delivery::Persistent,
            counts_unread: true,
            conversation_types: &[1, 2, 3],
            sender: Sender::User,
            max_payload_bytes: 8 * 1024,
            description: "A picture by https URL with mime type, dimensions, size and optional thumbnail",
        }
    }

    fn validate(_ctx: &Context, p: Image) -> Result<Image, Rejection> {
        check::https_url("url", &p.url)?;
        let mime = check::mime("mime", &p.mime, &["image"])?;
        check::range("width", p.width, 1, MAX_SIDE)?;
        check::range("height", p.height, 1, MAX_SIDE)?;
        check::range("size", p.size, 1, MAX_BYTES)?;
        if let Some(t) = &p.thumbnail {
            check::https_url("thumbnail.url", &t.url)?;
            check::range("thumbnail.width", t.width, 1, 1024)?;
            check::range("thumbnail.height", t.height, 1, 1024)?;
        }
        let caption = check::optional_text("caption", &p.caption, 1000)?;
        Ok(Image { mime, caption, ..p })
    }

    fn preview(p: &Image) -> String {
        if p.caption.is_empty() {
            "[image]".into()
        } else {
            format!("[image] {}", p.caption)
        }
    }

    fn examples() -> Vec<Example> {
        vec![
            Example::accept(
                "photo",
                1,
                r#"{"url":"https://cdn.example.com/a.jpg","mime":"image/jpeg","width":800,"height":600,"size":120000}"#,
            ),
            Example::accept(
                "with-thumbnail",
                2,
                r#"{"url":"https://cdn.example.com/a.png","mime":"IMAGE/PNG","width":4000,"height":3000,"size":9000000,"thumbnail":{"url":"https://cdn.example.com/a_t.png","width":200,"height":150},"caption":" sunset "}"#,
            ),
            Example::reject(
                "http-url",
                1,
                r#"{"url":"http://cdn.example.com/a.jpg","mime":"image/jpeg","width":8,"height":6,"size":1}"#,
            ),
            Example::reject(
                "not-an-image",
                1,
                r#"{"url":"https://cdn.example.com/a.pdf","mime":"application/pdf","width":8,"height":6,"size":1}"#,
            ),
            Example::reject(
                "zero-width",
                1,
                r#"{"url":"https://cdn.example.com/a.jpg","mime":"image/jpeg","width":0,"height":6,"size":1}"#,
            ),
            Example::reject(
                "too-big",
                1,
                r#"{"url":"https://cdn.example.com/a.jpg","mime":"image/jpeg","width":8,"height":6,"size":999999999999}"#,
            ),
            Example::reject(
                "missing-fields",
                1,
                r#"{"url":"https://cdn.example.com/a.jpg"}"#,
            ),
            Example::reject(
                "url-with-space",
                1,
                r#"{"url":"https://cdn.example.com/a b.jpg","mime":"image/jpeg","width":8,"height":6,"size":1}"#,
            ),
        ]
    }
}

export_plugin!(ImageKind);

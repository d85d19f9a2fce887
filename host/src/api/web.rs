//! The web client and the operator page: files of `web/` embedded in the binary at build
//! time and served as they are — no build step, no CDN, nothing fetched at run time.
//! `/` is the client, `/operator` the operator page, `/web/…` their scripts and styles
//! (the SDK among them, as `tsc` built it from `clients/js/src`). Every answer carries a
//! Content-Security-Policy without inline scripts, and an ETag so browsers revalidate
//! cheaply (`Cache-Control: no-cache`: a new server version is seen at once).

use std::sync::LazyLock;

use axum::Router;
use axum::extract::Path;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, ETAG, IF_NONE_MATCH, REFERRER_POLICY,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

use super::Error;

/// Scripts and styles from this server only; images may be the `https://` URLs of image
/// messages (the client loads one only when the reader asks for it); the WebSocket and the API are this server (`'self'` covers `ws:`/`wss:` to it).
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' https: data:; connect-src 'self'; manifest-src 'self'; \
    base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

macro_rules! assets {
    ($($path:literal),* $(,)?) => {
        &[$(($path, include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../web/", $path)))),*]
    };
}

/// Every served file, by its path under `web/` (a test checks that nothing under `web/`
/// but the tests is left out).
pub const FILES: &[(&str, &[u8])] = assets![
    "index.html",
    "operator.html",
    "app/icon.svg",
    "app/style.css",
    "app/main.js",
    "app/dom.js",
    "app/kinds.js",
    "app/chat.js",
    "app/operator.js",
    "vendor/courier-client/backoff.js",
    "vendor/courier-client/client.js",
    "vendor/courier-client/connection.js",
    "vendor/courier-client/emitter.js",
    "vendor/courier-client/errors.js",
    "vendor/courier-client/events.js",
    "vendor/courier-client/http.js",
    "vendor/courier-client/index.js",
    "vendor/courier-client/indexeddb.js",
    "vendor/courier-client/outbox.js",
    "vendor/courier-client/overview.js",
    "vendor/courier-client/store.js",
    "vendor/courier-client/sync.js",
    "vendor/courier-client/types.js",
];

struct Asset {
    body: &'static [u8],
    content_type: &'static str,
    etag: HeaderValue,
}

static ASSETS: LazyLock<Vec<(&'static str, Asset)>> = LazyLock::new(|| {
    FILES
        .iter()
        .map(|&(path, body)| {
            let hash = Sha256::digest(body);
            let hex: String = hash[..12].iter().map(|b| format!("{b:02x}")).collect();
            let etag = HeaderValue::from_str(&format!("\"{hex}\"")).expect("hex is a header");
            let asset = Asset {
                body,
                content_type: content_type(path),
                etag,
            };
            (path, asset)
        })
        .collect()
});

/// The content type of a served file, by its extension.
pub fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("json") => "application/json",
        _ => "application/octet-stream",
    }
}

fn serve(path: &str, headers: &HeaderMap) -> Response {
    let Some((_, asset)) = ASSETS.iter().find(|(p, _)| *p == path) else {
        return Error::not_found(format!("no file at /web/{path}")).into_response();
    };
    let fresh = headers
        .get(IF_NONE_MATCH)
        .is_some_and(|tags| matches_etag(tags.as_bytes(), asset.etag.as_bytes()));
    let mut res = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        asset.body.into_response()
    };
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    h.insert(ETAG, asset.etag.clone());
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    res
}

/// Whether an `If-None-Match` value names `etag`: `*`, or a comma-separated list of tags,
/// weak ones (`W/"…"`) included (RFC 9110 compares them weakly for `GET`).
fn matches_etag(tags: &[u8], etag: &[u8]) -> bool {
    tags.split(|&b| b == b',').any(|tag| {
        let tag = tag.trim_ascii();
        tag == b"*" || tag.strip_prefix(b"W/").unwrap_or(tag) == etag
    })
}

/// `/` (the client), `/operator` (the operator page), `/web/{*path}` (their files).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(client))
        .route("/operator", get(operator))
        .route("/web/{*path}", get(asset))
}

/// `GET /`: the web client.
pub async fn client(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

/// `GET /operator`: the operator page (it asks for the admin token).
pub async fn operator(headers: HeaderMap) -> Response {
    serve("operator.html", &headers)
}

/// `GET /web/{*path}`: a script, style or image of the two pages.
pub async fn asset(
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
    headers: HeaderMap,
) -> Response {
    match path {
        // The pages are served at `/` and `/operator` only.
        Ok(Path(p)) if !p.ends_with(".html") => serve(&p, &headers),
        Ok(Path(p)) => Error::not_found(format!("no file at /web/{p}")).into_response(),
        Err(e) => Error::bad_request(format!("bad path: {e}")).into_response(),
    }
}

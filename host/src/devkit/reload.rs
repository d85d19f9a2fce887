//! A dev server's reload, as `plugin watch` asks for it: `POST {url}/admin/plugins/reload`
//! with the admin token, over HTTP/1.1 on one connection of its own.

use std::time::Duration;

use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// The most characters of a server's answer `watch` prints.
const MAX_ANSWER_CHARS: usize = 4000;

/// A reload can compile a large component (a Python kind takes seconds on an idle machine).
const RELOAD_TIMEOUT: Duration = Duration::from_secs(600);

/// The dev server `plugin watch` reloads.
#[derive(Debug, Clone)]
pub struct DevServer {
    /// As given, for messages.
    pub url: String,
    /// `host:port`, to connect to and for the Host header.
    authority: String,
    /// The URL's path, without a trailing `/` (a server behind a path prefix).
    base: String,
    token: String,
}

/// What the server answered.
#[derive(Debug)]
pub enum Answer {
    /// 200: the plugins now loaded (`GET /admin/plugins`'s entries).
    Reloaded(Vec<Value>),
    /// Any other status: the error code and message, as the server words them.
    Refused {
        status: u16,
        code: String,
        message: String,
    },
}

impl DevServer {
    /// `http://host:port[/prefix]`; https is not spoken (a dev server is on loopback).
    pub fn new(url: &str, token: String) -> Result<DevServer, String> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("--server {url:?} is not a URL: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!(
                "--server {url:?}: give an http:// URL (watch does not speak https; a dev server listens on loopback)"
            ));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("--server {url:?} has no host"))?;
        let authority = match authority.port() {
            Some(_) => authority.to_string(),
            None => format!("{authority}:80"),
        };
        Ok(DevServer {
            url: url.to_string(),
            authority,
            base: uri.path().trim_end_matches('/').to_string(),
            token,
        })
    }

    /// Asks the server to reload its config and plugins.
    pub async fn reload(&self) -> Result<Answer, String> {
        let (status, body) = tokio::time::timeout(
            RELOAD_TIMEOUT,
            self.post(&format!("{}/admin/plugins/reload", self.base)),
        )
        .await
        .map_err(|_| format!("no answer within {} s", RELOAD_TIMEOUT.as_secs()))??;
        let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if status == 200 {
            return Ok(Answer::Reloaded(
                json["plugins"].as_array().cloned().unwrap_or_default(),
            ));
        }
        let (code, message) = match &json["error"] {
            Value::Object(e) => (
                e.get("code").and_then(Value::as_str).unwrap_or_default(),
                e.get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            ),
            _ => ("", String::from_utf8_lossy(&body).into_owned()),
        };
        Ok(Answer::Refused {
            status,
            code: code.to_string(),
            message: terminal_safe(&message),
        })
    }

    async fn post(&self, path: &str) -> Result<(u16, Bytes), String> {
        let reach = |e: &dyn std::fmt::Display| format!("cannot reach {}: {e}", self.url);
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|e| reach(&e))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| reach(&e))?;
        let conn = tokio::spawn(conn);
        let req = http::Request::post(if path.is_empty() { "/" } else { path })
            .header(http::header::HOST, &self.authority)
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            )
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let res = sender.send_request(req).await.map_err(|e| reach(&e))?;
        let status = res.status().as_u16();
        let body = res
            .into_body()
            .collect()
            .await
            .map_err(|e| reach(&e))?
            .to_bytes();
        conn.abort();
        Ok((status, body))
    }
}

/// Text from a server, fit for a terminal: line breaks kept, every other control
/// character escaped, cut to `MAX_ANSWER_CHARS`.
pub fn terminal_safe(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == MAX_ANSWER_CHARS {
            out.push_str(&format!("… ({} bytes)", s.len()));
            break;
        }
        if c.is_control() && c != '\n' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_answers() {
        let s = DevServer::new("http://127.0.0.1:8080/", "t".into()).unwrap();
        assert_eq!(
            (s.authority.as_str(), s.base.as_str()),
            ("127.0.0.1:8080", "")
        );
        let s = DevServer::new("http://dev.local/courier", "t".into()).unwrap();
        assert_eq!(
            (s.authority.as_str(), s.base.as_str()),
            ("dev.local:80", "/courier")
        );
        assert!(DevServer::new("https://x:1", "t".into()).is_err());
        assert!(DevServer::new("127.0.0.1:8080", "t".into()).is_err());
        assert_eq!(terminal_safe("a\nb\u{1b}[2J"), "a\nb\\u{1b}[2J");
    }
}

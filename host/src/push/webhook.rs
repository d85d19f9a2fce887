//! The deployer's webhook: a signed `POST` of one notice over HTTP/1.1 (or HTTPS with the
//! system's roots), on connections kept open between notices.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hmac::{Hmac, Mac as _};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use sha2::Sha256;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls;

/// Idle connections kept for the next notices.
const IDLE: usize = 16;

pub struct Webhook {
    uri: http::Uri,
    /// `host:port`, to connect to.
    address: String,
    /// The Host header.
    host: String,
    tls: Option<(TlsConnector, rustls::pki_types::ServerName<'static>)>,
    secret: Vec<u8>,
    timeout: Duration,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl Webhook {
    /// The webhook at `url` (checked by the config), signing with `secret`.
    pub fn new(url: &str, secret: &str, timeout: Duration) -> Result<Webhook, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let https = uri.scheme_str() == Some("https");
        let host = uri
            .host()
            .ok_or_else(|| format!("{url}: no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = match https {
            false => None,
            true => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in rustls_native_certs::load_native_certs().certs {
                    let _ = roots.add(cert);
                }
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| format!("TLS: {e}"))?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                let name = rustls::pki_types::ServerName::try_from(host.clone())
                    .map_err(|e| format!("{url}: {e}"))?;
                Some((TlsConnector::from(Arc::new(config)), name))
            }
        };
        Ok(Webhook {
            address: format!("{host}:{port}"),
            host: uri
                .authority()
                .map_or_else(|| host.clone(), |a| a.to_string()),
            uri,
            tls,
            secret: secret.as_bytes().to_vec(),
            timeout,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// `x-courier-signature` of `body` at `t` (ms): `t=…,v1=` the hex HMAC-SHA256 of
    /// `"{t}.{body}"`.
    pub fn signature(&self, t: i64, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.secret).expect("any key length");
        mac.update(t.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
    }

    /// POSTs one notice; `Ok` for a 2xx answer within the timeout, else why not.
    pub async fn post(&self, body: &[u8], notice_id: &str, now_ms: i64) -> Result<(), String> {
        match tokio::time::timeout(self.timeout, self.attempt(body, notice_id, now_ms)).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {} s", self.timeout.as_secs())),
        }
    }

    async fn attempt(&self, body: &[u8], notice_id: &str, now_ms: i64) -> Result<(), String> {
        let mut sender = match self.take_idle() {
            Some(s) => s,
            None => self.connect().await?,
        };
        let path = self
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let request = http::Request::post(path)
            .header(http::header::HOST, &self.host)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("x-courier-signature", self.signature(now_ms, body))
            .header("x-courier-notice", notice_id)
            .body(Full::new(Bytes::copy_from_slice(body)))
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        // Read the answer whole, so the connection can carry the next notice.
        let _ = response.into_body().collect().await;
        if sender.is_ready() {
            let mut idle = self.idle.lock().expect("idle connections");
            if idle.len() < IDLE {
                idle.push(sender);
            }
        }
        match status.is_success() {
            true => Ok(()),
            false => Err(format!("answered {status}")),
        }
    }

    fn take_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().expect("idle connections");
        while let Some(s) = idle.pop() {
            if s.is_ready() {
                return Some(s);
            }
        }
        None
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let tcp = TcpStream::connect(&self.address)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", self.address))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => handshake(tcp).await,
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| format!("TLS with {}: {e}", self.address))?;
                handshake(tls).await
            }
        }
    }
}

async fn handshake<S>(io: S) -> Result<SendRequest<Full<Bytes>>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

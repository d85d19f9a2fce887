//! A webhook receiver on loopback for the offline-push tests: it records every request
//! (the notice's headers and body) and answers 200, 500, or never.

use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::sync::mpsc;

/// How the receiver answers.
#[derive(Clone, Copy, PartialEq)]
pub enum Mode {
    Ok,
    Fail,
    Hang,
}

/// One notice as the receiver got it.
#[derive(Debug)]
pub struct Got {
    pub signature: String,
    pub notice_id: String,
    pub raw: Bytes,
    pub body: Value,
}

/// A webhook receiver on loopback: every request it gets, in order.
pub struct Receiver {
    pub addr: String,
    got: mpsc::UnboundedReceiver<Got>,
}

impl Receiver {
    pub async fn start(mode: Mode) -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, got) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let tx = tx.clone();
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let tx = tx.clone();
                        async move {
                            let header = |n: &str| {
                                req.headers()
                                    .get(n)
                                    .and_then(|v| v.to_str().ok())
                                    .unwrap_or_default()
                                    .to_string()
                            };
                            let (signature, notice_id) =
                                (header("x-courier-signature"), header("x-courier-notice"));
                            let raw = req.into_body().collect().await.unwrap().to_bytes();
                            let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
                            let _ = tx.send(Got {
                                signature,
                                notice_id,
                                raw,
                                body,
                            });
                            match mode {
                                Mode::Hang => std::future::pending::<()>().await,
                                Mode::Ok | Mode::Fail => {}
                            }
                            let status = if mode == Mode::Ok { 200 } else { 500 };
                            Ok::<_, std::convert::Infallible>(
                                hyper::Response::builder()
                                    .status(status)
                                    .body(Full::new(Bytes::from_static(b"{}")))
                                    .unwrap(),
                            )
                        }
                    },
                );
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service),
                );
            }
        });
        Receiver { addr, got }
    }

    /// The next request (safety net 30 s).
    pub async fn next(&mut self) -> Got {
        tokio::time::timeout(Duration::from_secs(30), self.got.recv())
            .await
            .expect("no notice within 30 s")
            .expect("receiver gone")
    }
}

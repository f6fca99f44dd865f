//! Writing answers: JSON bodies, warnings in `Warning` headers, and the streamed bodies of
//! watches (JSON lines) and followed logs.

use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// `v` as a JSON answer.
pub(super) fn json_response(status: StatusCode, v: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(v).unwrap_or_default(),
    )
        .into_response()
}

/// The response with a `Warning: 299` header for each warning, as kube-apiserver sends them.
pub(super) fn with_warnings(mut response: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let text = format!("299 - {}", serde_json::to_string(w).unwrap_or_default());
        if let Ok(v) = axum::http::HeaderValue::from_str(&text) {
            response.headers_mut().append(header::WARNING, v);
        }
    }
    response
}

/// One line of a watch: `v` as JSON and a newline.
pub(super) fn ndjson(v: &Value) -> Bytes {
    let mut line = serde_json::to_vec(v).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}
/// A body stream fed by `produce` through a channel.
pub(super) fn body_stream<F, Fut>(
    produce: F,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(produce(tx));
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}

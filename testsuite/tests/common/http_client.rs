//! A minimal HTTP/1.1 client for the API tests: one request per
//! connection, JSON in and out, and server-sent events read to the end.

use std::net::SocketAddr;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Where the API listens, and the headers every request carries.
#[derive(Clone)]
pub struct Client {
    pub addr: SocketAddr,
    pub headers: Vec<(String, String)>,
}

impl Client {
    /// Serves `router` on a free loopback port.
    pub async fn serve(router: axum::Router) -> Client {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Client {
            addr,
            headers: Vec::new(),
        }
    }

    /// The same server, with `name: value` on every request.
    pub fn with(&self, name: &str, value: &str) -> Client {
        let mut client = self.clone();
        client.headers.push((name.to_owned(), value.to_owned()));
        client
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send("GET", path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send("POST", path, Some(body)).await
    }

    /// The raw response: status line, headers and body as text.
    pub async fn raw(&self, method: &str, path: &str, body: Option<Value>) -> String {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
        // `Host: test` unless a test names its own.
        if !self
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("host"))
        {
            req.push_str("Host: test\r\n");
        }
        for (name, value) in &self.headers {
            req.push_str(&format!("{name}: {value}\r\n"));
        }
        if !body.is_empty() {
            req.push_str("Content-Type: application/json\r\n");
        }
        req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
        let mut stream = TcpStream::connect(self.addr).await.unwrap();
        stream.write_all(req.as_bytes()).await.unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await.unwrap();
        raw
    }

    pub async fn send(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let raw = self.raw(method, path, body).await;
        let status = raw.split(' ').nth(1).unwrap().parse().unwrap();
        let body = raw.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        (status, serde_json::from_str(body).unwrap_or(Value::Null))
    }

    /// The events of a server-sent event stream, read until the server
    /// closes it: `(event name, data as JSON)`.
    pub async fn events(&self, path: &str) -> Vec<(String, Value)> {
        let raw = self.raw("GET", path, None).await;
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        assert!(head.contains("text/event-stream"), "{head}");
        // The body is chunked: keep only the `event:` and `data:` lines.
        let mut events = Vec::new();
        let mut name = None;
        for line in body.lines() {
            if let Some(n) = line.strip_prefix("event: ") {
                name = Some(n.to_owned());
            } else if let Some(data) = line.strip_prefix("data: ") {
                let data = serde_json::from_str(data).unwrap();
                events.push((name.take().unwrap_or_default(), data));
            }
        }
        events
    }
}

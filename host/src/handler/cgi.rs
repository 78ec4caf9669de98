//! WASI preview1 commands spoken to over CGI (RFC 3875, as Go's `net/http/cgi`, WAGI
//! and Spin speak it): the request as environment and stdin, the response as a header
//! block, a blank line and the body on stdout.

use super::store::{self, GuestState, Output};
use super::{Connection, Failure, Shared, cgi_response};
use axum::body::Body;
use bytes::Bytes;
use http::{Response, header};
use std::sync::Arc;
use std::time::Instant;
use wasmtime::{Engine, InstancePre, Module, Store};
use wasmtime_wasi::p2::pipe::MemoryInputPipe;

pub struct CgiHandler {
    pre: InstancePre<GuestState>,
    shared: Arc<Shared>,
}

impl CgiHandler {
    pub fn new(engine: &Engine, module: &Module, shared: Arc<Shared>) -> wasmtime::Result<Self> {
        let pre = store::linker(engine)?.instantiate_pre(module)?;
        Ok(Self { pre, shared })
    }

    pub async fn invoke(
        &self,
        request: http::Request<Bytes>,
        connection: Connection,
    ) -> Result<Response<Body>, Failure> {
        let log = super::call_log(&request);
        let share = super::request_share(&request, &self.shared.limits);
        let (parts, body) = request.into_parts();
        let output = Output::new(share.clone());
        let mut wasi = output.wasi(&self.shared);
        wasi.envs(&cgi_environment(&parts, body.len(), connection))
            .stdin(MemoryInputPipe::new(body));
        let mut store = store::new_store(self.pre.module().engine(), &self.shared, wasi.build_p1(), log, share);

        // The epoch deadline stops a guest only while it computes: one asleep in a host
        // call (`poll_oneoff`) is stopped here, at its deadline.
        let deadline = store.data().deadline;
        let outcome = tokio::time::timeout_at(deadline.into(), self.run(&mut store)).await;
        output.log_stderr();
        match outcome {
            Ok(outcome) => outcome.map_err(|error| Failure::classify(error, &store.data().limiter))?,
            Err(_) => return Err(Failure::Timeout),
        }
        parse_response(&output.stdout.contents())
    }

    async fn run(&self, store: &mut Store<GuestState>) -> wasmtime::Result<()> {
        let started = Instant::now();
        let instance = super::instantiate_span(self.pre.instantiate_async(&mut *store)).await?;
        self.shared.metrics.observe_instantiate(started.elapsed());
        let start = instance.get_typed_func::<(), ()>(&mut *store, "_start")?;
        match start.call_async(&mut *store, ()).await {
            Err(error) if matches!(error.downcast_ref::<wasmtime_wasi::I32Exit>(), Some(exit) if exit.0 == 0) => Ok(()),
            other => other,
        }
    }
}

/// The CGI meta-variables for one request.
fn cgi_environment(
    parts: &http::request::Parts,
    content_length: usize,
    connection: Connection,
) -> Vec<(String, String)> {
    let uri = &parts.uri;
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let server_name = host.rsplit_once(':').map_or(host, |(name, _)| name);
    let mut env = vec![
        ("GATEWAY_INTERFACE".into(), "CGI/1.1".into()),
        (
            "SERVER_SOFTWARE".into(),
            concat!("wasmless-runtime/", env!("CARGO_PKG_VERSION")).into(),
        ),
        ("SERVER_PROTOCOL".into(), format!("{:?}", parts.version)),
        ("SERVER_NAME".into(), server_name.to_string()),
        ("SERVER_PORT".into(), connection.local_port.to_string()),
        ("REQUEST_METHOD".into(), parts.method.to_string()),
        (
            "REQUEST_URI".into(),
            uri.path_and_query().map_or("/", |pq| pq.as_str()).to_string(),
        ),
        ("SCRIPT_NAME".into(), String::new()),
        ("PATH_INFO".into(), path_info(uri.path())),
        ("QUERY_STRING".into(), uri.query().unwrap_or("").to_string()),
        ("REMOTE_ADDR".into(), connection.remote.ip().to_string()),
        ("REMOTE_PORT".into(), connection.remote.port().to_string()),
        ("CONTENT_LENGTH".into(), content_length.to_string()),
    ];
    if let Some(content_type) = parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) {
        env.push(("CONTENT_TYPE".into(), content_type.to_string()));
    }
    for name in parts.headers.keys() {
        // Content-Type and Content-Length have variables of their own; `Proxy` would
        // set HTTP_PROXY, which HTTP clients in the handler read as their proxy (httpoxy).
        if name == header::CONTENT_TYPE || name == header::CONTENT_LENGTH || name.as_str() == "proxy" {
            continue;
        }
        let values: Vec<&str> = parts
            .headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let variable = format!("HTTP_{}", name.as_str().to_ascii_uppercase().replace('-', "_"));
        env.push((variable, values.join(", ")));
    }
    env
}

/// Reads a CGI response ([`cgi_response::parse`]) into what axum sends.
fn parse_response(output: &[u8]) -> Result<Response<Body>, Failure> {
    cgi_response::parse(output)
        .map(|response| response.map(Body::from))
        .map_err(|e| Failure::BadResponse(e.to_string()))
}

/// RFC 3875 §4.1.5: PATH_INFO is the decoded path (REQUEST_URI keeps it as sent).
/// WASI environment values are UTF-8, so a path that decodes to anything else is
/// passed as sent.
fn path_info(path: &str) -> String {
    percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .map_or_else(|_| path.to_string(), |decoded| decoded.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;
    use http_body_util::BodyExt;

    async fn body_text(response: Response<Body>) -> String {
        String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
    }

    #[tokio::test]
    async fn status_headers_and_body() {
        let response =
            parse_response(b"Status: 201 Created\r\nContent-Type: text/plain\r\nX-A: 1\r\n\r\nhello\n").unwrap();
        assert_eq!(response.status(), 201);
        assert_eq!(response.headers()["x-a"], "1");
        assert_eq!(body_text(response).await, "hello\n");
    }

    #[tokio::test]
    async fn defaults_and_redirects() {
        let plain = parse_response(b"Content-Type: text/plain\n\nok").unwrap();
        assert_eq!(plain.status(), 200);
        assert_eq!(body_text(plain).await, "ok");
        let redirect = parse_response(b"Location: /elsewhere\n\n").unwrap();
        assert_eq!(redirect.status(), 302);
        assert_eq!(redirect.headers()["location"], "/elsewhere");
    }

    #[test]
    fn malformed_output_is_a_bad_response() {
        for output in [
            &b""[..],
            b"just a body",
            b"Content-Type text/plain\n\nbody",
            b"Status: teapot\n\n",
            b"Bad Name: x\n\n",
        ] {
            let failure = parse_response(output).unwrap_err();
            assert_eq!(
                failure.status(),
                StatusCode::BAD_GATEWAY,
                "{:?}",
                String::from_utf8_lossy(output)
            );
        }
    }

    /// The CGI environment for `request`, as from a client at 10.1.2.3 to port 8080.
    fn environment_of(request: http::Request<()>, content_length: usize) -> std::collections::HashMap<String, String> {
        let (parts, ()) = request.into_parts();
        let connection = Connection {
            remote: "10.1.2.3:5555".parse().unwrap(),
            local_port: 8080,
        };
        cgi_environment(&parts, content_length, connection)
            .into_iter()
            .collect()
    }

    #[test]
    fn environment_follows_rfc_3875() {
        let request = http::Request::post("/path/x?a=1&b=2")
            .header("host", "example.com:8080")
            .header("content-type", "application/json")
            .header("x-multi", "one")
            .header("x-multi", "two")
            .header("authorization", "Bearer t")
            .header("proxy", "http://evil")
            .body(())
            .unwrap();
        let env = environment_of(request, 7);
        assert_eq!(env["REQUEST_METHOD"], "POST");
        assert_eq!(env["REQUEST_URI"], "/path/x?a=1&b=2");
        assert_eq!(env["PATH_INFO"], "/path/x");
        assert_eq!(env["QUERY_STRING"], "a=1&b=2");
        assert_eq!(env["CONTENT_LENGTH"], "7");
        assert_eq!(env["CONTENT_TYPE"], "application/json");
        assert_eq!(env["SERVER_NAME"], "example.com");
        assert_eq!(env["REMOTE_ADDR"], "10.1.2.3");
        assert_eq!(env["HTTP_X_MULTI"], "one, two");
        assert_eq!(env["HTTP_AUTHORIZATION"], "Bearer t");
        assert!(!env.contains_key("HTTP_PROXY"));
        assert!(!env.contains_key("HTTP_CONTENT_TYPE"));
    }

    #[test]
    fn path_info_is_decoded_and_request_uri_is_not() {
        let env = environment_of(http::Request::get("/caf%C3%A9/a%20b?q=%20").body(()).unwrap(), 0);
        assert_eq!(env["PATH_INFO"], "/café/a b");
        assert_eq!(env["REQUEST_URI"], "/caf%C3%A9/a%20b?q=%20");
        assert_eq!(env["QUERY_STRING"], "q=%20");
        assert_eq!(
            path_info("/bad%FF"),
            "/bad%FF",
            "not UTF-8 once decoded: passed as sent"
        );
    }
}

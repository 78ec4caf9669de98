//! An in-memory Kubernetes API server for tests, the one fake of the workspace: a
//! `tower::Service` that a `kube::Client` talks to in-process (the operator's tests), and
//! the same server on loopback with a kubeconfig (the builder's tests, which run the builder
//! as a process). It stores objects by path, answers GET, LIST (with label selectors), POST,
//! PUT, DELETE, server-side apply and merge patches (of objects and their status), records
//! every request, and can fail or hang chosen requests, so tests assert on the objects
//! written rather than on a scripted sequence of calls. Watches are answered with nothing,
//! ever (a quiet cluster), and lists and GETs asked for metadata only
//! (`PartialObjectMetadataList`, `PartialObjectMetadata`) get metadata only. Like the real
//! API server it refuses an Event whose note is over 1024 bytes, and a RoleBinding of a
//! Role that does not exist (what it answers a client without the `bind` verb, as the
//! operator is: it cannot check that the binding grants nothing the client lacks).

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// One request the fake answered.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub content_type: String,
    /// The Accept header: `…as=PartialObjectMetadataList…` for a metadata-only list,
    /// `…as=PartialObjectMetadata…` for a metadata-only GET.
    pub accept: String,
    pub body: Option<Value>,
    /// A server-side apply that created the object (which the API server authorizes as
    /// `create` as well as `patch`).
    pub created: bool,
    /// Who sent it: `None` for [`FakeApiServer::client`], the name given to
    /// [`FakeApiServer::as_user`] otherwise.
    pub user: Option<String>,
}

impl Recorded {
    pub fn is_write(&self) -> bool {
        self.method != Method::GET
    }

    /// The resource (plural) the request is about: `configmaps`, `jobs`, `functions`, ….
    pub fn resource(&self) -> &str {
        parse(&self.path).map(|p| p.resource).unwrap_or_default()
    }

    pub fn is_status(&self) -> bool {
        self.path.ends_with("/status")
    }

    /// The RBAC verbs the request is authorized as: a server-side apply that creates the
    /// object needs `create` as well as `patch`.
    pub fn verbs(&self) -> Vec<&'static str> {
        let named = parse(&self.path).is_some_and(|p| p.name.is_some());
        let verb = match self.method {
            Method::GET if self.query.split('&').any(|q| q == "watch=true" || q == "watch=1") => "watch",
            Method::GET if named => "get",
            Method::GET => "list",
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH if self.created => return vec!["patch", "create"],
            Method::PATCH => "patch",
            Method::DELETE if named => "delete",
            Method::DELETE => "deletecollection",
            _ => "unknown",
        };
        vec![verb]
    }

    /// `resource` or `resource/subresource`, as RBAC names it.
    pub fn rbac_resource(&self) -> String {
        match parse(&self.path) {
            Some(ParsedPath {
                resource,
                subresource: Some(sub),
                ..
            }) => format!("{resource}/{sub}"),
            Some(parsed) => parsed.resource.to_string(),
            None => String::new(),
        }
    }
}

struct Fault {
    method: Method,
    path_contains: String,
    remaining: usize,
    /// The status answered instead of the request's own answer; `None` never answers.
    answer: Option<StatusCode>,
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Value>,
    /// The last server-side apply of each object: a field it set that the next one leaves
    /// out is removed, as the API server removes the fields a manager no longer applies.
    applied: BTreeMap<String, Value>,
    log: Vec<Recorded>,
    faults: Vec<Fault>,
    version: u64,
}

/// Longest Event note the API server stores, in bytes.
const MAX_EVENT_NOTE_BYTES: usize = 1024;

#[derive(Clone, Default)]
pub struct FakeApiServer {
    state: Arc<Mutex<State>>,
    user: Option<String>,
}

struct ParsedPath<'a> {
    collection: String,
    resource: &'a str,
    name: Option<&'a str>,
    subresource: Option<&'a str>,
}

/// `api/v1/RESOURCE/…` and `apis/GROUP/VERSION/RESOURCE/…`, with `namespaces/NS/` before
/// the resource where it is namespaced.
fn parse(path: &str) -> Option<ParsedPath<'_>> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let at = match segments.iter().position(|s| *s == "namespaces") {
        Some(namespaces) => namespaces + 2,
        None if segments.first() == Some(&"api") => 2,
        None => 3,
    };
    let resource = *segments.get(at)?;
    Some(ParsedPath {
        collection: segments[..=at].join("/"),
        resource,
        name: segments.get(at + 1).copied(),
        subresource: segments.get(at + 2).copied(),
    })
}

fn status_body(code: StatusCode, reason: &str, message: String) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    })
}

fn respond(code: StatusCode, body: &Value) -> Response<Vec<u8>> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).expect("json"))
        .expect("response")
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(byte) => {
                        out.push(byte);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

/// Whether an object's labels satisfy a selector of `k=v`, `k!=v` and `k` terms.
fn matches_selector(object: &Value, selector: &str) -> bool {
    let labels = object.pointer("/metadata/labels").and_then(Value::as_object);
    let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        if let Some((key, value)) = term.split_once("!=") {
            label(key.trim()) != Some(value.trim())
        } else if let Some((key, value)) = term.split_once('=') {
            label(key.trim().trim_end_matches('=')) == Some(value.trim())
        } else {
            label(term.trim()).is_some()
        }
    })
}

/// Maps merge key by key; anything else is replaced.
fn deep_merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(base), Value::Object(patch)) => {
            for (key, value) in patch {
                match base.get_mut(key) {
                    Some(existing) if existing.is_object() && value.is_object() => deep_merge(existing, value),
                    _ => {
                        base.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (base, patch) => *base = patch.clone(),
    }
}

/// Removes from `object` each map key that `before` (the last apply) set and `now` (this
/// one) leaves out: server-side apply's removal of the fields its manager no longer owns,
/// for objects one manager applies. Lists are replaced whole by the merge anyway.
fn remove_unapplied(object: &mut Value, before: &Value, now: &Value) {
    let (Value::Object(object), Value::Object(before)) = (object, before) else {
        return;
    };
    for (key, old) in before {
        match now.get(key) {
            None => {
                object.remove(key);
            }
            Some(new) => {
                if let Some(field) = object.get_mut(key) {
                    remove_unapplied(field, old, new);
                }
            }
        }
    }
}

/// RFC 7386 JSON merge patch.
fn merge_patch(base: &mut Value, patch: &Value) {
    if let Value::Object(patch) = patch {
        if !base.is_object() {
            *base = json!({});
        }
        let map = base.as_object_mut().expect("object");
        for (key, value) in patch {
            if value.is_null() {
                map.remove(key);
            } else {
                merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    } else {
        *base = patch.clone();
    }
}

impl FakeApiServer {
    pub fn new() -> Self {
        Self::default()
    }

    /// The same server, recording requests as sent by `user`: tests that play the builder or
    /// the kubelet use it, so the operator's own requests can be told apart.
    pub fn as_user(&self, user: &str) -> Self {
        Self {
            state: self.state.clone(),
            user: Some(user.into()),
        }
    }

    /// A client whose every request this fake answers.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.clone(), "default")
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().expect("state").log.clone()
    }

    /// Every request other than a GET.
    pub fn writes(&self) -> Vec<Recorded> {
        self.requests().into_iter().filter(Recorded::is_write).collect()
    }

    pub fn clear_requests(&self) {
        self.state.lock().expect("state").log.clear();
    }

    /// Fails the next `times` requests of `method` whose path contains `path_contains`
    /// with a 500, as an API server under trouble would.
    pub fn fail(&self, method: Method, path_contains: &str, times: usize) {
        self.state.lock().expect("state").faults.push(Fault {
            method,
            path_contains: path_contains.into(),
            remaining: times,
            answer: Some(StatusCode::INTERNAL_SERVER_ERROR),
        });
    }

    /// Answers the next requests of `method` whose path contains `path_contains` with
    /// `codes`, one each in order (a busy API server: 409, 429, 503 …).
    pub fn fail_with(&self, method: Method, path_contains: &str, codes: impl IntoIterator<Item = u16>) {
        let mut state = self.state.lock().expect("state");
        for code in codes {
            state.faults.push(Fault {
                method: method.clone(),
                path_contains: path_contains.into(),
                remaining: 1,
                answer: Some(StatusCode::from_u16(code).expect("a status code")),
            });
        }
    }

    /// Leaves the next `times` requests of `method` whose path contains `path_contains`
    /// without an answer, as an API server behind a broken connection would.
    pub fn hang(&self, method: Method, path_contains: &str, times: usize) {
        self.state.lock().expect("state").faults.push(Fault {
            method,
            path_contains: path_contains.into(),
            remaining: times,
            answer: None,
        });
    }

    /// All stored objects whose path contains `fragment`.
    pub fn objects(&self, fragment: &str) -> Vec<Value> {
        let state = self.state.lock().expect("state");
        state
            .objects
            .iter()
            .filter(|(path, _)| path.contains(fragment))
            .map(|(_, v)| v.clone())
            .collect()
    }

    fn next_version(state: &mut State) -> String {
        state.version += 1;
        state.version.to_string()
    }

    /// The response, or `None` for a request never answered (a hung one, or a watch).
    fn handle(&self, request: Recorded) -> Option<Response<Vec<u8>>> {
        let mut state = self.state.lock().expect("state");
        let at = state.log.len();
        state.log.push(request.clone());
        let Recorded {
            method,
            path,
            query,
            content_type,
            accept,
            body,
            ..
        } = request;
        if let Some(fault) = state
            .faults
            .iter_mut()
            .find(|f| f.remaining > 0 && f.method == method && path.contains(&f.path_contains))
        {
            fault.remaining -= 1;
            let code = fault.answer?;
            let reason = match code {
                StatusCode::CONFLICT => "Conflict",
                StatusCode::TOO_MANY_REQUESTS => "TooManyRequests",
                StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailable",
                _ => "InternalError",
            };
            return Some(respond(code, &status_body(code, reason, "injected failure".into())));
        }
        if state.log[at].verbs() == ["watch"] {
            return None;
        }
        let Some(parsed) = parse(&path) else {
            return Some(respond(
                StatusCode::NOT_FOUND,
                &status_body(StatusCode::NOT_FOUND, "NotFound", format!("no route {path}")),
            ));
        };
        if parsed.resource == "events"
            && let Some(note) = body.as_ref().and_then(|b| b.get("note")).and_then(Value::as_str)
            && note.len() > MAX_EVENT_NOTE_BYTES
        {
            // The real API server's words.
            return Some(respond(
                StatusCode::UNPROCESSABLE_ENTITY,
                &status_body(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    format!("Event is invalid: note: Too long: may not be more than {MAX_EVENT_NOTE_BYTES} bytes"),
                ),
            ));
        }
        if parsed.resource == "rolebindings"
            && matches!(method, Method::POST | Method::PUT | Method::PATCH)
            && parsed.subresource.is_none()
            && let Some(role) = body
                .as_ref()
                .and_then(|b| b.get("roleRef"))
                .filter(|r| r.get("kind").and_then(Value::as_str) == Some("Role"))
                .and_then(|r| r.get("name"))
                .and_then(Value::as_str)
        {
            let roles = parsed.collection.replace("/rolebindings", "/roles");
            if !state.objects.contains_key(&format!("{roles}/{role}")) {
                // The real API server's words.
                return Some(respond(
                    StatusCode::FORBIDDEN,
                    &status_body(
                        StatusCode::FORBIDDEN,
                        "Forbidden",
                        format!(
                            "rolebindings.rbac.authorization.k8s.io is forbidden: roles.rbac.authorization.k8s.io \"{role}\" not found"
                        ),
                    ),
                ));
            }
        }
        let response = self.answer(&mut state, at, method, parsed, query, content_type, accept, body);
        Some(response)
    }

    #[allow(clippy::too_many_arguments)]
    fn answer(
        &self,
        state: &mut State,
        at: usize,
        method: Method,
        parsed: ParsedPath<'_>,
        query: String,
        content_type: String,
        accept: String,
        body: Option<Value>,
    ) -> Response<Vec<u8>> {
        let path = state.log[at].path.clone();
        let not_found = |name: &str| {
            respond(
                StatusCode::NOT_FOUND,
                &status_body(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("{} {name} not found", parsed.resource),
                ),
            )
        };
        match (method.clone(), parsed.name) {
            (Method::GET, None) => {
                let selector = query_param(&query, "labelSelector").unwrap_or_default();
                let prefix = format!("{}/", parsed.collection);
                let metadata_only = accept.contains("as=PartialObjectMetadataList");
                let items: Vec<Value> = state
                    .objects
                    .iter()
                    .filter(|(p, _)| p.starts_with(&prefix) && !p[prefix.len()..].contains('/'))
                    .map(|(_, v)| v.clone())
                    .filter(|v| matches_selector(v, &selector))
                    .map(|v| {
                        if metadata_only {
                            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": v["metadata"]})
                        } else {
                            v
                        }
                    })
                    .collect();
                let version = state.version.to_string();
                let (api_version, kind) = if metadata_only {
                    ("meta.k8s.io/v1", "PartialObjectMetadataList")
                } else {
                    ("v1", "List")
                };
                respond(
                    StatusCode::OK,
                    &json!({"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": version}, "items": items}),
                )
            }
            (Method::GET, Some(name)) => match state.objects.get(&format!("{}/{name}", parsed.collection)) {
                Some(object) if accept.contains("as=PartialObjectMetadata") => respond(
                    StatusCode::OK,
                    &json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": object["metadata"]}),
                ),
                Some(object) => respond(StatusCode::OK, object),
                None => not_found(name),
            },
            (Method::POST, None) => {
                let mut object = body.unwrap_or_default();
                let name = match object.pointer("/metadata/name").and_then(Value::as_str) {
                    Some(name) => name.to_string(),
                    None => {
                        let prefix = object
                            .pointer("/metadata/generateName")
                            .and_then(Value::as_str)
                            .unwrap_or("object-")
                            .to_string();
                        format!("{prefix}{}", state.version + 1)
                    }
                };
                let key = format!("{}/{name}", parsed.collection);
                if state.objects.contains_key(&key) {
                    return respond(
                        StatusCode::CONFLICT,
                        &status_body(StatusCode::CONFLICT, "AlreadyExists", format!("{name} already exists")),
                    );
                }
                let version = Self::next_version(state);
                deep_merge(
                    &mut object,
                    &json!({"metadata": {"name": name, "uid": format!("uid-{version}"), "resourceVersion": version, "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"}}),
                );
                state.objects.insert(key, object.clone());
                respond(StatusCode::CREATED, &object)
            }
            (Method::PUT, Some(name)) => {
                let key = format!("{}/{name}", parsed.collection);
                let mut object = body.unwrap_or_default();
                let Some(existing) = state.objects.get(&key) else {
                    return not_found(name);
                };
                if object.pointer("/metadata/resourceVersion") != existing.pointer("/metadata/resourceVersion") {
                    return respond(
                        StatusCode::CONFLICT,
                        &status_body(StatusCode::CONFLICT, "Conflict", "the object has been modified".into()),
                    );
                }
                let version = Self::next_version(state);
                deep_merge(&mut object, &json!({"metadata": {"resourceVersion": version}}));
                state.objects.insert(key, object.clone());
                respond(StatusCode::OK, &object)
            }
            (Method::PATCH, Some(name)) => {
                let key = format!("{}/{name}", parsed.collection);
                let patch = body.unwrap_or_default();
                let apply = content_type.contains("apply-patch");
                let applied = (apply && parsed.subresource.is_none()).then(|| patch.clone());
                let existing = state.objects.get(&key).cloned();
                let version = Self::next_version(state);
                let object = match (existing, parsed.subresource) {
                    (None, Some(_)) => return not_found(name),
                    (None, None) if !apply => return not_found(name),
                    (None, None) => {
                        state.log[at].created = true;
                        let mut object = patch;
                        deep_merge(
                            &mut object,
                            &json!({"metadata": {"uid": format!("uid-{version}"), "resourceVersion": version, "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"}}),
                        );
                        object
                    }
                    (Some(mut object), Some("status")) => {
                        let status = patch.get("status").cloned().unwrap_or(Value::Null);
                        if apply {
                            object["status"] = status;
                        } else {
                            merge_patch(&mut object, &json!({"status": status}));
                        }
                        object["metadata"]["resourceVersion"] = json!(version);
                        object
                    }
                    (Some(mut object), _) => {
                        let old_spec = object.get("spec").cloned();
                        let mut patch = patch;
                        if let Some(map) = patch.as_object_mut() {
                            // The status subresource is written only through /status.
                            map.remove("status");
                        }
                        if apply {
                            if let Some(before) = state.applied.get(&key) {
                                remove_unapplied(&mut object, before, &patch);
                            }
                            deep_merge(&mut object, &patch);
                        } else {
                            merge_patch(&mut object, &patch);
                        }
                        if object.get("spec").cloned() != old_spec {
                            let generation = object
                                .pointer("/metadata/generation")
                                .and_then(Value::as_i64)
                                .unwrap_or(1);
                            object["metadata"]["generation"] = json!(generation + 1);
                        }
                        object["metadata"]["resourceVersion"] = json!(version);
                        object
                    }
                };
                if let Some(applied) = applied {
                    state.applied.insert(key.clone(), applied);
                }
                state.objects.insert(key, object.clone());
                respond(StatusCode::OK, &object)
            }
            (Method::DELETE, Some(name)) => {
                let key = format!("{}/{name}", parsed.collection);
                state.applied.remove(&key);
                match state.objects.remove(&key) {
                    Some(object) => respond(StatusCode::OK, &object),
                    None => not_found(name),
                }
            }
            _ => respond(
                StatusCode::METHOD_NOT_ALLOWED,
                &status_body(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    format!("{method} {path}"),
                ),
            ),
        }
    }
}

impl FakeApiServer {
    /// Records one request and answers it; `None` for a request never answered.
    fn receive(&self, parts: &http::request::Parts, bytes: &[u8]) -> Option<Response<Vec<u8>>> {
        let body = (!bytes.is_empty()).then(|| serde_json::from_slice(bytes).unwrap_or(Value::Null));
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        self.handle(Recorded {
            method: parts.method.clone(),
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or_default().to_string(),
            content_type: header("content-type"),
            accept: header("accept"),
            body,
            created: false,
            user: self.user.clone(),
        })
    }

    /// The same server on a loopback port, with a kubeconfig naming it, for a process
    /// (such as the builder) that finds its API server through `KUBECONFIG`.
    pub async fn serve(&self) -> ServedFakeApi {
        let this = self.clone();
        let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
            let this = this.clone();
            async move {
                let (parts, body) = request.into_parts();
                let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
                match this.receive(&parts, &bytes) {
                    Some(response) => response.map(axum::body::Body::from),
                    None => std::future::pending().await,
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let address = listener.local_addr().expect("its address");
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serving the fake API") });
        let kubeconfig = tempfile::NamedTempFile::new().expect("a kubeconfig file");
        std::fs::write(
            kubeconfig.path(),
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{address}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\ncurrent-context: fake\n"
            ),
        )
        .expect("writing the kubeconfig");
        ServedFakeApi {
            api: self.clone(),
            kubeconfig,
        }
    }
}

/// A [`FakeApiServer`] on loopback, for as long as this lives (the kubeconfig file with it).
pub struct ServedFakeApi {
    pub api: FakeApiServer,
    pub kubeconfig: tempfile::NamedTempFile,
}

impl tower_service::Service<Request<Body>> for FakeApiServer {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            match this.receive(&parts, &bytes) {
                Some(response) => Ok(response.map(Body::from)),
                None => std::future::pending().await,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_and_decoding() {
        let object = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        assert!(matches_selector(&object, "a=1,b"));
        assert!(matches_selector(&object, "a=1,b!=3"));
        assert!(!matches_selector(&object, "a=1,b!=2"));
        assert!(!matches_selector(&object, "c"));
        assert_eq!(percent_decode("a%3D1%2Cb"), "a=1,b");
    }

    #[test]
    fn paths_of_namespaced_and_cluster_scoped_resources() {
        let parts = |path| parse(path).map(|p| (p.collection, p.resource, p.name, p.subresource));
        assert_eq!(
            parts("/apis/apps/v1/namespaces/a/deployments/web/status"),
            Some((
                "apis/apps/v1/namespaces/a/deployments".into(),
                "deployments",
                Some("web"),
                Some("status")
            ))
        );
        assert_eq!(
            parts("/apis/storage.k8s.io/v1/csidrivers/code.wasmless.io"),
            Some((
                "apis/storage.k8s.io/v1/csidrivers".into(),
                "csidrivers",
                Some("code.wasmless.io"),
                None
            ))
        );
        assert_eq!(
            parts("/api/v1/nodes"),
            Some(("api/v1/nodes".into(), "nodes", None, None))
        );
        assert_eq!(parts("/api/v1/namespaces/a").map(|p| p.1), None, "a namespace itself");
    }
}

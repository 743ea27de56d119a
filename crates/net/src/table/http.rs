//! `--failure-table-url URL`: polls the LinkDB API's `GET /v1/failure-table`
//! (docs/api.md) with `If-None-Match`, every `--failure-table-poll-s`.
//!
//! [`HttpPoll`] is the pure part: the validator to send and what a response
//! means. 200: a table, judged by the hub's version rule; 304: unchanged;
//! 404: nothing published yet (not an error); anything else, and a request
//! that fails, counts in `polycorn_failure_table_source_errors` and is
//! retried at the next poll. The ETag of every 200 is remembered, a
//! malformed body's too, so a bad table is refused (and counted) once, not
//! on every poll; but not a table refused for its signature
//! (`X-Polycorn-Signature`, [`super::signature`]): the trainer may re-sign
//! the same bytes (a new key), so the next poll fetches it again.
//! [`HttpSource`] is the shell: hyper over rustls (ring),
//! trusting the Mozilla roots (webpki-roots) and the system's store.
//!
//! The API key is never sent in clear text by accident: with a key, an
//! `http://` URL is refused at start-up unless its host is a loopback
//! address or `--failure-table-insecure-http` says the network to it is
//! trusted (e.g. a Kubernetes Service inside the cluster).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::header::{HeaderValue, ETAG, IF_NONE_MATCH};
use hyper::{Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::Error;

use super::{Offered, SourceKind, TableHub};

/// Default `--failure-table-poll-s`.
pub const DEFAULT_POLL: Duration = Duration::from_secs(30);
/// The API's path for the current table, appended to a URL given without one.
pub const CURRENT_TABLE_PATH: &str = "/v1/failure-table";
/// Largest table body accepted (the API's largest benchmarked table is ~0.5 MB).
pub const MAX_BODY_BYTES: usize = 64 << 20;
/// One request, connection included, at most.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// What one response means.
#[derive(Debug, PartialEq, Eq)]
pub enum Fetched {
    /// 200: a table to judge.
    Table(Bytes),
    /// 304: the table we hold is current.
    NotModified,
    /// 404: no table published yet.
    NoTableYet,
    /// Another status: an error (the reason).
    Failed(String),
}

/// The pure state of the poll: the validator of the last table received.
#[derive(Debug, Default)]
pub struct HttpPoll {
    etag: Option<String>,
}

impl HttpPoll {
    /// The `If-None-Match` value to send: the ETag exactly as the server
    /// gave it (the API's is a quoted strong validator, `"<sha256>"`).
    pub fn if_none_match(&self) -> Option<&str> {
        self.etag.as_deref()
    }

    /// Forget the validator: the next poll fetches the table again (its
    /// signature was refused, and a new one does not change the ETag).
    pub fn forget(&mut self) {
        self.etag = None;
    }

    /// A response: its status, `ETag` header and body.
    pub fn on_response(&mut self, status: u16, etag: Option<&str>, body: Bytes) -> Fetched {
        match status {
            200 => {
                self.etag = etag.map(str::to_owned);
                Fetched::Table(body)
            }
            304 => Fetched::NotModified,
            404 => {
                // Nothing published (or it was withdrawn): the next table is new.
                self.etag = None;
                Fetched::NoTableYet
            }
            s => {
                let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
                Fetched::Failed(format!("HTTP {s}: {}", text.trim()))
            }
        }
    }
}

/// `--failure-table-url` and its options, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpOpts {
    pub url: String,
    pub every: Duration,
    /// Read from `--failure-table-api-key-file`, trimmed.
    pub api_key: Option<String>,
}

impl HttpOpts {
    /// From the flags; `None` without a URL (then the others must be unset).
    /// `insecure_http` is `--failure-table-insecure-http`: without it, a key
    /// is never sent over `http://` to a host that is not loopback.
    pub fn from_flags(
        url: Option<&str>,
        poll_s: Option<f64>,
        api_key_file: Option<&Path>,
        insecure_http: bool,
    ) -> Result<Option<HttpOpts>, Error> {
        let Some(url) = url else {
            if poll_s.is_some() || api_key_file.is_some() || insecure_http {
                return Err(Error::option(
                    "--failure-table-poll-s, --failure-table-api-key-file and --failure-table-insecure-http",
                    "need --failure-table-url",
                ));
            }
            return Ok(None);
        };
        let uri = table_uri(url)?;
        if api_key_file.is_some() && uri.scheme_str() == Some("http") && !insecure_http && !is_loopback(&uri) {
            return Err(Error::option(
                format!("--failure-table-url {url:?}"),
                format!(
                    "refusing to send the API key (--failure-table-api-key-file) in clear text over http:// to \
                     {:?}, which is not a loopback address; use an https:// URL, or add \
                     --failure-table-insecure-http if the network to it is trusted (e.g. a Service inside the cluster)",
                    uri.host().unwrap_or_default()
                ),
            ));
        }
        let every = match poll_s {
            None => DEFAULT_POLL,
            Some(s) if (1.0..=86_400.0).contains(&s) => Duration::from_secs_f64(s),
            Some(s) => {
                return Err(Error::option(
                    "--failure-table-poll-s",
                    format!("must be between 1 and 86400 seconds, got {s}"),
                ))
            }
        };
        let api_key = api_key_file
            .map(|p| {
                let k = std::fs::read_to_string(p).map_err(|source| Error::Io {
                    what: "reading --failure-table-api-key-file",
                    path: p.to_path_buf(),
                    source,
                })?;
                let k = k.trim().to_string();
                if k.is_empty() {
                    return Err(Error::option(format!("--failure-table-api-key-file {}", p.display()), "empty"));
                }
                Ok(k)
            })
            .transpose()?;
        Ok(Some(HttpOpts { url: url.into(), every, api_key }))
    }
}

/// The URL to poll: `url` itself, or with the API's path appended when it
/// has none (`https://linkdb.example` means its `/v1/failure-table`).
pub fn table_uri(url: &str) -> Result<Uri, Error> {
    let flag = || format!("--failure-table-url {url:?}");
    let uri: Uri = url.parse().map_err(|e| Error::option(flag(), format!("{e}")))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(Error::option(flag(), "use an http:// or https:// URL")),
    }
    if uri.path() != "/" || uri.query().is_some() {
        return Ok(uri);
    }
    let base = url.trim_end_matches('/');
    format!("{base}{CURRENT_TABLE_PATH}").parse().map_err(|e| Error::option(flag(), format!("{e}")))
}

/// `localhost`, 127.0.0.0/8 or ::1: a request that never leaves the machine.
fn is_loopback(uri: &Uri) -> bool {
    let Some(host) = uri.host() else { return false };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// TLS trusting the Mozilla roots and whatever the system's store holds
/// (a private CA installed on the host).
fn tls_config() -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        debug!(error = %e, "system certificate store: some certificates not loaded");
    }
    let (added, _ignored) = roots.add_parsable_certificates(native.certs);
    debug!(added, "system CA certificates trusted for --failure-table-url");
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// Polls the LinkDB API for the current table.
pub struct HttpSource {
    uri: Uri,
    api_key: Option<HeaderValue>,
    client: HttpsClient,
    poll: HttpPoll,
    hub: Arc<TableHub>,
    /// 404 logged once, not on every poll.
    said_no_table: bool,
}

impl std::fmt::Debug for HttpSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSource").field("uri", &self.uri).field("poll", &self.poll).finish_non_exhaustive()
    }
}

impl HttpSource {
    /// `api_key`: sent as `X-API-Key`.
    pub fn new(url: &str, api_key: Option<&str>, hub: Arc<TableHub>) -> Result<HttpSource, Error> {
        let uri = table_uri(url)?;
        let api_key = api_key
            .map(|k| {
                let mut v = HeaderValue::from_str(k.trim()).map_err(|_| {
                    Error::option("--failure-table-api-key-file", "the API key is not a valid header value")
                })?;
                v.set_sensitive(true);
                Ok::<_, Error>(v)
            })
            .transpose()?;
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config())
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new()).build(https);
        Ok(HttpSource { uri, api_key, client, poll: HttpPoll::default(), hub, said_no_table: false })
    }

    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// (status, ETag, signature, body).
    async fn fetch(&self) -> Result<(u16, Option<String>, Option<Bytes>, Bytes), String> {
        let mut req = Request::get(self.uri.clone());
        if let Some(tag) = self.poll.if_none_match() {
            req = req.header(IF_NONE_MATCH, tag);
        }
        if let Some(k) = &self.api_key {
            req = req.header("x-api-key", k.clone());
        }
        let req = req.body(Empty::new()).map_err(|e| format!("building the request: {e}"))?;
        let exchange = async {
            let resp = self.client.request(req).await.map_err(|e| format!("{e:#}: {}", source_chain(&e)))?;
            let status = resp.status();
            let etag = resp.headers().get(ETAG).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let sig = resp.headers().get(super::signature::HTTP_HEADER).map(|v| Bytes::copy_from_slice(v.as_bytes()));
            let body = if status == StatusCode::NOT_MODIFIED {
                Bytes::new()
            } else {
                Limited::new(resp.into_body(), MAX_BODY_BYTES)
                    .collect()
                    .await
                    .map_err(|e| format!("reading the body: {e}"))?
                    .to_bytes()
            };
            Ok((status.as_u16(), etag, sig, body))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| format!("no answer within {REQUEST_TIMEOUT:?}"))?
    }

    /// One poll: fetch and hand a new table to the hub.
    pub async fn poll_once(&mut self) {
        let origin = self.uri.to_string();
        let (status, etag, sig, body) = match self.fetch().await {
            Ok(r) => r,
            Err(e) => {
                self.hub.source_error(SourceKind::Http);
                warn!(url = %origin, error = %e, "failure-location table: request failed; retrying at the next poll");
                return;
            }
        };
        match self.poll.on_response(status, etag.as_deref(), body) {
            Fetched::Table(body) => {
                self.hub.source_ok(SourceKind::Http);
                self.said_no_table = false;
                if let Offered::BadSignature(_) = self.hub.offer(SourceKind::Http, &origin, &body, sig.as_deref()) {
                    self.poll.forget();
                }
            }
            Fetched::NotModified => {
                self.hub.source_ok(SourceKind::Http);
                debug!(url = %origin, "failure-location table unchanged");
            }
            Fetched::NoTableYet => {
                self.hub.source_ok(SourceKind::Http);
                if !self.said_no_table {
                    info!(url = %origin, "no failure-location table published yet");
                    self.said_no_table = true;
                }
            }
            Fetched::Failed(e) => {
                self.hub.source_error(SourceKind::Http);
                warn!(url = %origin, error = %e, "failure-location table: the API answered an error; retrying at the next poll");
            }
        }
    }

    /// Poll now, then every `every`, until `stop`.
    pub async fn run(mut self, every: Duration, mut stop: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = self.poll_once() => {}
                _ = stop.changed() => return,
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.changed() => return,
            }
        }
    }
}

/// "connection refused" and the like sit deep in hyper-util's error.
fn source_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = Vec::new();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push(s.to_string());
        cur = s.source();
    }
    out.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_200_sets_the_validator_a_304_keeps_it_and_a_404_clears_it() {
        let mut p = HttpPoll::default();
        assert_eq!(p.if_none_match(), None);
        let got = p.on_response(200, Some("\"abc\""), Bytes::from_static(b"{}"));
        assert_eq!(got, Fetched::Table(Bytes::from_static(b"{}")));
        assert_eq!(p.if_none_match(), Some("\"abc\""), "sent back exactly as received");
        assert_eq!(p.on_response(304, Some("\"abc\""), Bytes::new()), Fetched::NotModified);
        assert_eq!(p.if_none_match(), Some("\"abc\""));
        assert_eq!(p.on_response(404, None, Bytes::from_static(b"{\"title\":\"x\"}")), Fetched::NoTableYet);
        assert_eq!(p.if_none_match(), None);
    }

    #[test]
    fn other_statuses_are_errors_and_keep_the_validator() {
        let mut p = HttpPoll::default();
        p.on_response(200, Some("\"v1\""), Bytes::new());
        let Fetched::Failed(why) = p.on_response(503, None, Bytes::from_static(b"  database down ")) else { panic!() };
        assert_eq!(why, "HTTP 503: database down");
        assert_eq!(p.if_none_match(), Some("\"v1\""));
        assert!(matches!(p.on_response(401, None, Bytes::new()), Fetched::Failed(_)));
    }

    #[test]
    fn the_url_options_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        std::fs::write(&key, "s3cret\n").unwrap();
        let o = HttpOpts::from_flags(Some("https://api:8000"), None, Some(&key), false).unwrap().unwrap();
        assert_eq!((o.every, o.api_key.as_deref()), (DEFAULT_POLL, Some("s3cret")));
        assert!(matches!(HttpOpts::from_flags(None, None, None, false), Ok(None)));
        assert!(HttpOpts::from_flags(None, Some(5.0), None, false)
            .unwrap_err()
            .to_string()
            .contains("need --failure-table-url"));
        assert!(HttpOpts::from_flags(None, None, None, true)
            .unwrap_err()
            .to_string()
            .contains("need --failure-table-url"));
        assert!(HttpOpts::from_flags(Some("http://a"), Some(0.0), None, false)
            .unwrap_err()
            .to_string()
            .contains("poll-s"));
        let missing = dir.path().join("nope");
        assert!(HttpOpts::from_flags(Some("https://a"), None, Some(&missing), false)
            .unwrap_err()
            .to_string()
            .contains("nope"));
    }

    #[test]
    fn a_key_is_not_sent_over_plain_http_beyond_loopback_without_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        std::fs::write(&key, "s3cret\n").unwrap();
        let opts = |url: &str, insecure: bool| HttpOpts::from_flags(Some(url), None, Some(&key), insecure);
        for url in
            ["http://api:8000", "http://10.0.0.5/v1/failure-table", "http://linkdb.example", "http://[fd00::1]:80"]
        {
            let e = opts(url, false).unwrap_err().to_string();
            assert!(e.contains("--failure-table-insecure-http") && e.contains("https://"), "{url}: {e}");
            assert!(!e.contains("s3cret"), "the key is never in an error");
            assert!(opts(url, true).unwrap().is_some(), "{url}: allowed with the flag");
        }
        for url in [
            "http://127.0.0.1:8000",
            "http://127.8.9.1",
            "http://localhost:8000/",
            "http://[::1]:8000",
            "https://api:8000",
        ] {
            assert!(opts(url, false).unwrap().is_some(), "{url}: loopback or https needs no flag");
        }
        // Without a key there is nothing to leak: plain http is allowed.
        assert!(HttpOpts::from_flags(Some("http://10.0.0.5"), None, None, false).unwrap().is_some());
    }

    #[test]
    fn a_url_without_a_path_means_the_apis_current_table() {
        let u = |s: &str| table_uri(s).map(|u| u.to_string());
        assert_eq!(u("https://linkdb.example").unwrap(), "https://linkdb.example/v1/failure-table");
        assert_eq!(u("http://10.0.0.5:8000/").unwrap(), "http://10.0.0.5:8000/v1/failure-table");
        assert_eq!(
            u("https://gw.example/linkdb/v1/failure-table").unwrap(),
            "https://gw.example/linkdb/v1/failure-table"
        );
        assert!(u("ftp://x/y").unwrap_err().to_string().contains("http://"));
        assert!(u("not a url").is_err());
    }

    /// The API as the test scripts it.
    #[derive(Clone, Debug)]
    enum Mode {
        /// 200 with this body and ETag, 304 when If-None-Match matches it.
        Serve(String, &'static str),
        /// The same, with this `X-Polycorn-Signature`.
        Signed(String, &'static str, String),
        NotFound,
        Broken,
    }

    #[derive(Debug)]
    struct Api {
        mode: Mode,
        /// (If-None-Match, X-API-Key, status) of each request.
        seen: Vec<(Option<String>, Option<String>, u16)>,
    }

    async fn serve_api(api: Arc<std::sync::Mutex<Api>>) -> String {
        use axum::http::HeaderMap;
        use axum::response::{IntoResponse, Response};
        let app = axum::Router::new().route(
            "/v1/failure-table",
            axum::routing::get(move |h: HeaderMap| {
                let api = api.clone();
                async move {
                    let hv = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).map(str::to_owned);
                    let mut a = api.lock().unwrap();
                    let (inm, key) = (hv("if-none-match"), hv("x-api-key"));
                    let resp: Response = match a.mode.clone() {
                        Mode::Serve(_, etag) if inm.as_deref() == Some(etag) => {
                            (axum::http::StatusCode::NOT_MODIFIED, [("etag", etag)]).into_response()
                        }
                        Mode::Serve(body, etag) => ([("etag", etag)], body).into_response(),
                        Mode::Signed(_, etag, _) if inm.as_deref() == Some(etag) => {
                            (axum::http::StatusCode::NOT_MODIFIED, [("etag", etag)]).into_response()
                        }
                        Mode::Signed(body, etag, sig) => {
                            ([("etag", etag.to_string()), ("x-polycorn-signature", sig)], body).into_response()
                        }
                        Mode::NotFound => (axum::http::StatusCode::NOT_FOUND, "{\"title\":\"none\"}").into_response(),
                        Mode::Broken => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
                    };
                    a.seen.push((inm, key, resp.status().as_u16()));
                    resp
                }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn polls_the_api_with_its_etag_and_keeps_the_table_through_errors_and_garbage() {
        use crate::table::tests::table;
        let api = Arc::new(std::sync::Mutex::new(Api { mode: Mode::NotFound, seen: Vec::new() }));
        let base = serve_api(api.clone()).await;
        let set = |m: Mode| api.lock().unwrap().mode = m;
        let last = || api.lock().unwrap().seen.last().cloned().unwrap();
        let applied = Arc::new(std::sync::Mutex::new(Vec::new()));
        let a2 = applied.clone();
        let hub = TableHub::new(move |t| a2.lock().unwrap().push(t.version()));
        let mut src = HttpSource::new(&base, Some("k3y\n"), hub.clone()).unwrap();
        let stats = || hub.stats().source(SourceKind::Http);

        src.poll_once().await;
        assert_eq!(last(), (None, Some("k3y".into()), 404), "the API key is sent, trimmed");
        assert_eq!((hub.stats().version, stats().errors), (None, 0), "404: no table yet, not an error");
        assert!(stats().last_ok_unix_s.is_some());

        set(Mode::Serve(table(1, 3), "\"e1\""));
        src.poll_once().await;
        assert_eq!(last().2, 200);
        assert_eq!(hub.stats().version, Some(1));
        src.poll_once().await;
        assert_eq!(last(), (Some("\"e1\"".into()), Some("k3y".into()), 304), "If-None-Match carries the ETag");
        assert_eq!(stats().loads, 1, "304: nothing to do");

        set(Mode::Broken);
        src.poll_once().await;
        assert_eq!(last().2, 500);
        assert_eq!((hub.stats().version, stats().errors), (Some(1), 1), "an error keeps the table");

        set(Mode::Serve("garbage".into(), "\"g\""));
        src.poll_once().await;
        src.poll_once().await;
        assert_eq!(last(), (Some("\"g\"".into()), Some("k3y".into()), 304), "the bad body is not fetched again");
        assert_eq!((hub.stats().version, hub.stats().rejected()), (Some(1), 1), "refused once, the table kept");

        set(Mode::Serve(table(2, 1), "\"e2\""));
        src.poll_once().await;
        assert_eq!(hub.stats().version, Some(2));
        set(Mode::Serve(table(1, 3), "\"e1\""));
        src.poll_once().await;
        assert_eq!(last().2, 200);
        assert_eq!(hub.stats().version, Some(2), "an older version is ignored");
        assert_eq!((stats().not_newer, stats().rejected), (1, 1), "and not counted as rejected");
        assert_eq!(*applied.lock().unwrap(), vec![1, 2]);
    }

    #[tokio::test]
    async fn an_unreachable_api_counts_as_a_source_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let hub = TableHub::new(|_| {});
        let mut src = HttpSource::new(&format!("http://127.0.0.1:{port}/v1/failure-table"), None, hub.clone()).unwrap();
        src.poll_once().await;
        let s = hub.stats().source(SourceKind::Http);
        assert_eq!((s.errors, s.last_ok_unix_s), (1, None));
    }

    /// With a verify key: the signature comes in `X-Polycorn-Signature`; a
    /// table refused for it is fetched again at the next poll (no
    /// If-None-Match), so the same bytes re-signed (a new key) are taken
    /// although their ETag did not change.
    #[tokio::test]
    async fn a_table_refused_for_its_signature_is_fetched_again() {
        use crate::table::signature::tests::Signer;
        use crate::table::tests::table;
        let (trainer, forger) = (Signer::new(1), Signer::new(2));
        let sig = |s: &Signer, body: &str| String::from_utf8(s.sign(body.as_bytes())).unwrap();
        let api = Arc::new(std::sync::Mutex::new(Api { mode: Mode::NotFound, seen: Vec::new() }));
        let base = serve_api(api.clone()).await;
        let set = |m: Mode| api.lock().unwrap().mode = m;
        let last = || api.lock().unwrap().seen.last().cloned().unwrap();
        let hub = TableHub::build(Default::default(), Some(trainer.verifier()), |_| {});
        let mut src = HttpSource::new(&base, None, hub.clone()).unwrap();

        let (t1, t2) = (table(1, 1), table(2, 1));
        set(Mode::Signed(t1.clone(), "\"e1\"", sig(&trainer, &t1)));
        src.poll_once().await;
        assert_eq!(hub.stats().version, Some(1), "a signed table is taken");
        set(Mode::Signed(t2.clone(), "\"e2\"", sig(&forger, &t2)));
        src.poll_once().await;
        src.poll_once().await;
        assert_eq!(last(), (None, None, 200), "fetched again, without If-None-Match");
        assert_eq!(hub.stats().source(SourceKind::Http).unverified, 2);
        set(Mode::Serve(t2.clone(), "\"e2\""));
        src.poll_once().await;
        assert_eq!(hub.stats().source(SourceKind::Http).unverified, 3, "no signature header at all");
        assert_eq!(hub.stats().version, Some(1), "the table in use stays");
        set(Mode::Signed(t2.clone(), "\"e2\"", sig(&trainer, &t2)));
        src.poll_once().await;
        assert_eq!(hub.stats().version, Some(2), "the same bytes, re-signed, are taken");
        src.poll_once().await;
        assert_eq!(last(), (Some("\"e2\"".into()), None, 304), "then polled with its ETag again");
    }
}

//! A panic in any task becomes a clean shutdown that the health check
//! reports (its own test binary: the panic hook is process-wide).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    for _ in 0..100 {
        if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
            s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            return out;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the metrics endpoint never listened on {addr}");
}

#[tokio::test]
async fn a_panicking_task_shuts_the_process_down_and_fails_the_health_check() {
    polycorn_net::panics::install("test");
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let ready: polycorn_net::metrics::Ready = Arc::new(|| true.into());
    tokio::spawn(polycorn_net::metrics::serve(addr, Vec::new(), ready, std::future::pending()));
    let before = get(addr, "/healthz").await;
    assert!(before.starts_with("HTTP/1.0 200") || before.starts_with("HTTP/1.1 200"), "{before}");
    assert_eq!(polycorn_net::panics::exit_code(0), 0);

    // A subflow task (say) panics on something a peer sent.
    let task = tokio::spawn(async { panic!("attempt to subtract with overflow") });
    assert!(task.await.unwrap_err().is_panic());
    tokio::time::timeout(Duration::from_secs(30), polycorn_net::shutdown_signal())
        .await
        .expect("the shutdown signal resolves after a panic");

    let after = get(addr, "/healthz").await;
    assert!(after.contains(" 503 ") && after.contains("panicked"), "{after}");
    let metrics = get(addr, "/metrics").await;
    assert!(metrics.contains("polycorn_panics_total{} 1.0"), "{metrics}");
    assert_eq!(polycorn_net::panics::exit_code(0), polycorn_net::panics::EXIT_PANICKED);
}

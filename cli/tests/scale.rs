//! `distlock ls` over 100 000 held locks: every one listed, in order. Ignored by default (it takes about a
//! minute to set up); it prints how long the listing took and the tool's peak memory, the figures the README
//! quotes. Run with `cargo test --release -p distlock-cli --test scale -- --ignored --nocapture`.

use std::process::Stdio;
use std::time::{Duration, Instant};

use distlock_tests::RedisServer;

const LOCKS: usize = 100_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "sets up 100 000 locks; run by hand for the README's figures"]
async fn ls_lists_100_000_held_locks_in_order() {
    let server = RedisServer::new();
    let url = server.url();
    let client = distlock::Client::builder().redis(&url).owner("scale").build().await.expect("client");
    let mut guards = Vec::with_capacity(LOCKS);
    let started = Instant::now();
    let names: Vec<String> = (0..LOCKS).map(|i| format!("job:{i:06}")).collect();
    for chunk in names.chunks(1000) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|name| {
                let request = client.lock(name.as_str()).ttl(Duration::from_secs(1800)).metadata("scale test");
                tokio::spawn(request.acquire())
            })
            .collect();
        for task in tasks {
            guards.push(task.await.expect("no panic").expect("acquire"));
        }
    }
    eprintln!("held {LOCKS} locks in {:.1?}", started.elapsed());

    for args in [&["ls"][..], &["ls", "--json"], &["ls", "--unsorted"]] {
        let started = Instant::now();
        // GNU time's report of the child's peak resident memory goes to the file, not the output.
        let report = tempfile_path();
        let output = tokio::process::Command::new("/usr/bin/time")
            .args(["-f", "%M", "-o", &report, env!("CARGO_BIN_EXE_distlock"), "--url", &url])
            .args(args)
            .env_remove("REDIS_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .await
            .expect("run distlock");
        let elapsed = started.elapsed();
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
        let peak_kb = std::fs::read_to_string(&report).unwrap_or_default();
        let _ = std::fs::remove_file(&report);
        let text = String::from_utf8_lossy(&output.stdout);
        if args == ["ls", "--json"] {
            let listed: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            assert_eq!(listed.as_array().expect("array").len(), LOCKS);
        } else {
            let keys: Vec<&str> = text.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
            assert_eq!(keys.len(), LOCKS);
            if args == ["ls"] {
                assert!(keys.windows(2).all(|w| w[0] < w[1]), "not sorted");
            }
        }
        eprintln!("distlock {}: {LOCKS} locks in {elapsed:.2?}, peak RSS {} KB", args.join(" "), peak_kb.trim());
    }
    // What the listings cost Redis, by its own count.
    let stats: String =
        redis::cmd("INFO").arg("commandstats").query_async(&mut server.connection().await).await.expect("INFO");
    for line in stats.lines().filter(|l| l.starts_with("cmdstat_scan:") || l.starts_with("cmdstat_evalsha:")) {
        eprintln!("{line}");
    }
    drop(guards);
}

fn tempfile_path() -> String {
    std::env::temp_dir().join(format!("distlock-scale-{}.time", std::process::id())).display().to_string()
}

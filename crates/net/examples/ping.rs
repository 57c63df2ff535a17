//! Round-trip latency of a small request (getattr of the root) through the crest client
//! against a running server: `cargo run --release -p crest-net --example ping -- ADDR [N]`.

use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let addr = args.get(1).cloned().unwrap_or_else(|| "127.0.0.1:7410".into());
    let n: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let client = match crest_net::Client::connect(&addr, crest_net::ClientOptions::default()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ping: {e}");
            std::process::exit(2);
        }
    };
    let t = Instant::now();
    for _ in 0..n {
        if let Err(e) = client.call_one(crest_proto::Op::GetAttr { ino: 1 }) {
            eprintln!("ping: {e:?}");
            std::process::exit(1);
        }
    }
    println!("{:.1} us per getattr round trip ({n} calls)", t.elapsed().as_secs_f64() * 1e6 / f64::from(n));
}

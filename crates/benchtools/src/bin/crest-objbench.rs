//! The data store's own speed through crest's HTTP client (`crest-objects`), the
//! baseline `bench/objects.sh` compares a mount with: `--count` objects of `--size`
//! bytes PUT (with `If-None-Match: *`, as a mount does) then GET, `--parallel` at a
//! time, through URLs signed as the server signs them. Endpoint and keys from the AWS_*
//! variables, the bucket from CREST_DATA_URL; the objects are deleted after. Prints one
//! JSON line: MiB/s each way and the median request time.

use anyhow::{Context, Result};
use clap::Parser;
use crest_objects::Transfers;
use crest_server::objects::{parse_listing, DataAccess, DataConfig};
use crest_store::fs::objects::DataStore;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Parser)]
struct Args {
    /// Bytes per object.
    #[arg(long, default_value_t = 1 << 20)]
    size: usize,
    /// Objects.
    #[arg(long, default_value_t = 64)]
    count: u64,
    /// Transfers at once.
    #[arg(long, default_value_t = 1)]
    parallel: usize,
    /// Only count the objects under CREST_DATA_URL's prefix (what a test checks the
    /// collector left) and print the number.
    #[arg(long)]
    count_objects: bool,
}

fn now() -> crest_proto::Time {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    crest_proto::Time { sec: d.as_secs() as i64, nsec: d.subsec_nanos() }
}

fn run(
    access: &DataAccess,
    ids: &[u64],
    parallel: usize,
    each: impl Fn(&DataAccess, u64) -> Result<()> + Sync,
) -> Result<(Duration, Vec<Duration>)> {
    let start = Instant::now();
    let chunk = ids.len().div_ceil(parallel.max(1)).max(1);
    let times = std::thread::scope(|s| -> Result<Vec<Duration>> {
        let workers: Vec<_> = ids
            .chunks(chunk)
            .map(|part| {
                let each = &each;
                s.spawn(move || -> Result<Vec<Duration>> {
                    part.iter()
                        .map(|&id| {
                            let t = Instant::now();
                            each(access, id).map(|()| t.elapsed())
                        })
                        .collect()
                })
            })
            .collect();
        let mut all = Vec::new();
        for w in workers {
            all.extend(w.join().map_err(|_| anyhow::anyhow!("worker panicked"))??);
        }
        Ok(all)
    })?;
    Ok((start.elapsed(), times))
}

fn main() -> Result<()> {
    let a = Args::parse();
    let var = |k: &str| std::env::var(k).with_context(|| format!("{k} is not set"));
    let config = DataConfig {
        endpoint: var("AWS_ENDPOINT_URL")?,
        region: std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into()),
        key: var("AWS_ACCESS_KEY_ID")?,
        secret: var("AWS_SECRET_ACCESS_KEY")?,
        token: std::env::var("AWS_SESSION_TOKEN").ok(),
    };
    let store_id = now().sec as u64 ^ u64::from(std::process::id()) << 32 | 1 << 63;
    let store = DataStore { url: var("CREST_DATA_URL")?, store_id };
    let access = DataAccess::new(&config, &store).map_err(anyhow::Error::msg)?;
    let t = Transfers::new(Duration::from_secs(60));
    if a.count_objects {
        let (bucket, prefix) = store.bucket_and_prefix().map_err(anyhow::Error::msg)?;
        let lister = DataAccess::new(&config, &DataStore { url: format!("s3://{bucket}"), store_id: 0 })
            .map_err(anyhow::Error::msg)?;
        let (mut n, mut token) = (0, None::<String>);
        loop {
            let url = lister.list_url_under(&prefix, token.as_deref(), now());
            let (keys, next) = parse_listing(&t.get_text(&url)?).map_err(anyhow::Error::msg)?;
            n += keys.len();
            match next {
                Some(x) if !keys.is_empty() => token = Some(x),
                _ => break,
            }
        }
        println!("{n}");
        return Ok(());
    }
    let body: Vec<u8> = (0..a.size).map(|i| (i as u8).wrapping_mul(31)).collect();
    let ids: Vec<u64> = (1..=a.count).collect();
    let (put, put_times) = run(&access, &ids, a.parallel, |acc, id| Ok(t.put_once(&acc.put_url(id, now()), &body)?))?;
    let (get, get_times) = run(&access, &ids, a.parallel, |acc, id| {
        let got = t.get_range(&acc.get_url(id, now()), 0, a.size)?;
        anyhow::ensure!(got == body, "object {id} read back other bytes");
        Ok(())
    })?;
    for id in &ids {
        t.delete(&access.delete_url(*id, now()))?;
    }
    let mib = (a.size as f64 * a.count as f64) / f64::from(1 << 20);
    let median = |mut v: Vec<Duration>| {
        v.sort_unstable();
        v.get(v.len() / 2).map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    println!(
        "{{\"size\": {}, \"count\": {}, \"parallel\": {}, \"put_mib_s\": {:.1}, \"get_mib_s\": {:.1}, \"put_median_ms\": {:.2}, \"get_median_ms\": {:.2}}}",
        a.size,
        a.count,
        a.parallel,
        mib / put.as_secs_f64(),
        mib / get.as_secs_f64(),
        median(put_times),
        median(get_times)
    );
    Ok(())
}

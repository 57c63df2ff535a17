//! Mounts a crest server without the CLI, for trying the FUSE layer by hand:
//! `cargo run -p crest-fuse --example mount -- 127.0.0.1:7410 /mnt/x [-o opt,opt] [--ro]`.
//! Serves until unmounted; RUST_LOG sets the log level.

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let mut args = std::env::args().skip(1);
    let (Some(addr), Some(mnt)) = (args.next(), args.next()) else {
        eprintln!("usage: mount ADDR MOUNTPOINT [-o OPTS] [--ro]");
        std::process::exit(2);
    };
    let mut opts = crest_fuse::MountOptions { fsname: addr.clone(), ..Default::default() };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--ro" => opts.read_only = true,
            "-o" => opts.extra.extend(args.next()),
            other => eprintln!("ignoring {other}"),
        }
    }
    let client = crest_net::Client::connect(&addr, crest_net::ClientOptions::default())
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let r = crest_fuse::mount_blocking(client, &PathBuf::from(mnt), &opts);
    tracing::info!("mount_blocking returned {r:?}");
    r
}

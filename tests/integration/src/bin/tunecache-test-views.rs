//! `tunecache-test-views`: a caller of job views for the hostile-user tests, run as another
//! uid through `setpriv`. Each subcommand makes its requests on one connection and prints
//! one JSON line saying what the daemon answered.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use serde_json::json;
use tunecache_client::{proto, Client};
use tunecache_integration::test_key;

#[derive(Parser)]
struct Args {
    #[arg(long)]
    socket: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// One Lookup of problems `<prefix>0` .. `<prefix><keys-1>` in `view`: each hit's
    /// problem and config.
    Read {
        #[arg(long)]
        view: String,
        #[arg(long, default_value = "p")]
        prefix: String,
        #[arg(long)]
        keys: usize,
    },
    /// A Lookup of problem `problem` in each of the views `<prefix>-0` .. `<prefix>-<count-1>`
    /// (each a new view: one pin if the key is held, none if it is not).
    Views {
        #[arg(long)]
        prefix: String,
        #[arg(long)]
        count: usize,
        #[arg(long)]
        problem: String,
    },
    /// One ListViews page.
    List {
        #[arg(long, default_value = "")]
        after: String,
        #[arg(long, default_value_t = 0)]
        limit: u32,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = Client::connect(&args.socket).await?;
    let mut raw = client.raw();
    match args.command {
        Command::Read { view, prefix, keys } => {
            let keys = (0..keys)
                .map(|i| test_key("gemm", &format!("{prefix}{i}")))
                .collect();
            let hits = raw
                .lookup(proto::LookupRequest { keys, view })
                .await?
                .into_inner()
                .hits;
            let hits: Vec<_> = hits
                .into_iter()
                .map(|hit| {
                    json!([
                        hit.key.unwrap_or_default().problem,
                        hit.result.unwrap_or_default().config
                    ])
                })
                .collect();
            println!("{}", json!({ "hits": hits }));
        }
        Command::Views {
            prefix,
            count,
            problem,
        } => {
            let mut hits = 0;
            for i in 0..count {
                let request = proto::LookupRequest {
                    keys: vec![test_key("gemm", &problem)],
                    view: format!("{prefix}-{i}"),
                };
                hits += raw.lookup(request).await?.into_inner().hits.len();
            }
            println!("{}", json!({ "views": count, "hits": hits }));
        }
        Command::List { after, limit } => {
            let page = raw
                .list_views(proto::ListViewsRequest { limit, after })
                .await?
                .into_inner();
            let views: Vec<_> = page
                .views
                .iter()
                .map(|v| json!({"name": v.name, "uid": v.uid, "pins": v.pins}))
                .collect();
            println!("{}", json!({ "views": views, "next": page.next }));
        }
    }
    Ok(())
}

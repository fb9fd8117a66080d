//! `tunecache view`: the node's views listed (name, owner, pins, idle time) and one ended.

use anyhow::Context;
use serde_json::{json, Value};
use tunecache_client::{proto, Client};

/// A view's idle time for people: milliseconds under a second, then the two largest units.
fn idle_text(idle_ms: u64) -> String {
    let secs = idle_ms / 1000;
    match secs {
        0 => format!("{idle_ms} ms"),
        1..=59 => format!("{secs} s"),
        60..=3599 => format!("{} min {} s", secs / 60, secs % 60),
        _ => format!("{} h {} min", secs / 3600, secs % 3600 / 60),
    }
}

fn print_views(views: &[proto::ViewInfo], as_json: bool) {
    if as_json {
        let list: Vec<Value> = views
            .iter()
            .map(|view| {
                json!({"name": view.name, "uid": view.uid, "pins": view.pins, "idle_ms": view.idle_ms})
            })
            .collect();
        println!("{}", Value::Array(list));
        return;
    }
    if views.is_empty() {
        eprintln!("no views on this node");
        return;
    }
    let width = views
        .iter()
        .map(|view| view.name.len())
        .chain(["VIEW".len()])
        .max()
        .unwrap_or_default();
    println!("{:<width$}  {:>10}  {:>10}  IDLE", "VIEW", "UID", "PINS");
    for view in views {
        println!(
            "{:<width$}  {:>10}  {:>10}  {}",
            view.name,
            view.uid,
            view.pins,
            idle_text(view.idle_ms)
        );
    }
}

/// `view list`.
pub async fn list(client: &Client, as_json: bool) -> anyhow::Result<()> {
    print_views(&client.list_views().await.context("list views")?, as_json);
    Ok(())
}

/// `view end NAME`.
pub async fn end(client: &Client, name: &str, as_json: bool) -> anyhow::Result<()> {
    let ended = client.end_view(name).await.context("end view")?;
    if as_json {
        println!(
            "{}",
            json!({"name": name, "ended": ended.ended, "pins_dropped": ended.pins_dropped})
        );
    } else if ended.ended {
        println!("ended view {name}: {} pins dropped", ended.pins_dropped);
    } else {
        println!("no view {name} on this node: nothing ended here");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::idle_text;

    #[test]
    fn idle_time_reads_in_the_largest_units() {
        assert_eq!(idle_text(0), "0 ms");
        assert_eq!(idle_text(999), "999 ms");
        assert_eq!(idle_text(1_000), "1 s");
        assert_eq!(idle_text(59_999), "59 s");
        assert_eq!(idle_text(61_000), "1 min 1 s");
        assert_eq!(idle_text(3_600_000), "1 h 0 min");
        assert_eq!(idle_text(86_400_000 + 5 * 60_000), "24 h 5 min");
    }
}

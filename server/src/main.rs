//! `tunecached`: flags, logging, runtime and signals. Everything else lives in the library.

use std::io::IsTerminal;

use anyhow::Context;
use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};
use tracing_subscriber::EnvFilter;
use tunecache_server::config::{Config, LogFormat, RuntimeFlavor};

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Installs the SIGTERM/SIGINT handlers now (before the daemon serves, so a signal that
/// arrives right after READY is never the default, fatal one) and returns the future that
/// resolves on either. Must be called inside the runtime.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        let (Ok(mut terminate), Ok(mut interrupt)) = handlers else {
            tracing::error!("cannot install signal handlers; stop the daemon with SIGKILL");
            return std::future::pending().await;
        };
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM received"),
            _ = interrupt.recv() => tracing::info!("SIGINT received"),
        }
    }
}

fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    init_logging(config.log_format);
    let mut runtime = match config.runtime {
        RuntimeFlavor::MultiThread => tokio::runtime::Builder::new_multi_thread(),
        RuntimeFlavor::CurrentThread => tokio::runtime::Builder::new_current_thread(),
    };
    let runtime = runtime
        .enable_all()
        .thread_name("tunecached")
        .build()
        .context("building the tokio runtime")?;
    runtime
        .block_on(async {
            let shutdown = shutdown_signal();
            let socket = tunecache_server::server::bind(&config)?;
            tunecache_server::server::run(config, socket, shutdown).await
        })
        .context("tunecached failed")
}

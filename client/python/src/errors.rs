//! Client errors as the Python exceptions the package raised before: `tunecache.RpcError` (with
//! grpcio's `code()` and `details()`; see `tunecache/errors.py` for how it stays catchable as
//! `grpc.RpcError`), `UntrustedSocketError`, `UntrustedDaemonError`, `ArtifactError` (an
//! artifact this client refused), and OSError for a local file operation that failed. The exception classes
//! are Python classes of `tunecache.errors`; this module fills them from the Rust client's
//! structured errors, including the refused entry's index from the status's BadRequest detail.

use pyo3::prelude::*;
use tunecache_client::{refused_entry_index, ClientError, UntrustedSocket};

const ERRORS_MODULE: &str = "tunecache.errors";

/// A Python exception of `tunecache.errors` made by `factory(*args)`; if even that fails, the
/// failure itself (an import error is then the clearer report).
fn raised<'py, A>(py: Python<'py>, factory: &str, args: A) -> PyErr
where
    A: pyo3::call::PyCallArgs<'py>,
{
    let made = py
        .import(ERRORS_MODULE)
        .and_then(|module| module.getattr(factory))
        .and_then(|factory| factory.call1(args));
    match made {
        Ok(exception) => PyErr::from_value(exception),
        Err(error) => error,
    }
}

/// A gRPC status as `tunecache.RpcError`. A call past its deadline is DEADLINE_EXCEEDED, as
/// grpcio reports it, also when it was this client's own timer that ran out (which tonic calls
/// CANCELLED "Timeout expired").
pub fn status_error(py: Python<'_>, status: &tonic::Status) -> PyErr {
    let (code, message) = if tunecache_client::past_deadline(status) {
        (
            tonic::Code::DeadlineExceeded,
            "Deadline Exceeded".to_owned(),
        )
    } else {
        (status.code(), status.message().to_owned())
    };
    raised(
        py,
        "_rpc_error",
        (code as i32, message, refused_entry_index(status)),
    )
}

/// A client error as the exception the package raises for it. Failing to reach the daemon is
/// `UNAVAILABLE`, as grpcio reports it.
pub fn client_error(py: Python<'_>, error: ClientError) -> PyErr {
    match error {
        ClientError::Rpc(status) => status_error(py, &status),
        ClientError::UntrustedSocket(refused)
        | ClientError::Autostart(tunecache_client::autostart::AutostartError::UntrustedSocket(
            refused,
        )) => raised(
            py,
            "UntrustedSocketError",
            (untrusted_socket_message(&refused),),
        ),
        ClientError::UntrustedDaemon { .. } => {
            raised(py, "UntrustedDaemonError", (format!("tunecache: {error}"),))
        }
        ClientError::Artifact(reason) => raised(
            py,
            "ArtifactError",
            (format!("tunecache: artifact refused: {reason}"),),
        ),
        // A TUNECACHE_MODE, or Client(mode=...), that is no mode: the caller's error.
        ClientError::Mode(unknown) => {
            pyo3::exceptions::PyValueError::new_err(format!("tunecache: {unknown}"))
        }
        // OSError(errno, text) is the subclass of its errno (FileNotFoundError...).
        ClientError::Io { what, source } => match source.raw_os_error() {
            Some(errno) => {
                pyo3::exceptions::PyOSError::new_err((errno, format!("{what}: {source}")))
            }
            None => pyo3::exceptions::PyOSError::new_err(format!("{what}: {source}")),
        },
        other => raised(
            py,
            "_rpc_error",
            (
                tonic::Code::Unavailable as i32,
                other.to_string(),
                None::<usize>,
            ),
        ),
    }
}

/// The package's wording for a refused default socket (the Rust check's reasons, said as the
/// Python package always said them: tests and users match on "symlink", "owned by uid N",
/// "writable by group or others").
fn untrusted_socket_message(refused: &UntrustedSocket) -> String {
    const ADVICE: &str = "set TUNECACHE_SOCKET to a socket you trust";
    match refused {
        UntrustedSocket::Symlink { path } => format!(
            "tunecache: refusing the default socket: {} is a symlink; remove it, or {ADVICE}",
            path.display()
        ),
        UntrustedSocket::NotADirectory { path } => format!(
            "tunecache: refusing the default socket: {} is not a directory",
            path.display()
        ),
        UntrustedSocket::Owner {
            path,
            owner,
            expected,
            ..
        } => format!(
            "tunecache: refusing the default socket: {} is owned by uid {owner}, not by \
             {expected}; another user may have created it. Remove it, or {ADVICE}",
            path.display()
        ),
        UntrustedSocket::Writable { path, mode, .. } => format!(
            "tunecache: refusing the default socket: directory {} is writable by group or \
             others (mode {mode:04o}); it must be 0700 or 0755. Fix the mode, or {ADVICE}",
            path.display()
        ),
        UntrustedSocket::Io { .. } => {
            format!("tunecache: cannot check the default socket: {refused}")
        }
    }
}

/// The refused entry's index from a status given by its parts (a grpcio error's code, details
/// and `grpc-status-details-bin` trailer), read by the Rust client's one reader.
#[pyfunction]
#[pyo3(signature = (code, message, status_details))]
pub fn refused_entry_index_of(
    code: i32,
    message: String,
    status_details: Vec<u8>,
) -> Option<usize> {
    let status =
        tonic::Status::with_details(tonic::Code::from_i32(code), message, status_details.into());
    refused_entry_index(&status)
}

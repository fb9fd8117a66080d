//! Unit tests of the settings: flags, their defaults and refusals.

use super::*;

fn config(args: &[&str]) -> Config {
    Config::parse_from(std::iter::once("tunecached").chain(args.iter().copied()))
}

#[test]
fn cluster_settings_come_from_the_cluster_flags() {
    assert!(config(&[]).cluster_settings().unwrap().is_none());
    assert!(config(&["--cluster-url", ""])
        .cluster_settings()
        .unwrap()
        .is_none());

    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "s3cret\n").unwrap();
    let settings = config(&[
        "--cluster-url",
        "redis://user@10.1.2.3:6380/2",
        "--cluster-password-file",
        password.to_str().unwrap(),
        "--cluster-prefix",
        "site-a:",
        "--cluster-timeout-ms",
        "0",
        "--cluster-lease-ms",
        "5",
        "--node-name",
        "n7",
        "--cluster-publish-queue",
        "0",
        "--cluster-stream-max-len",
        "64",
        "--cluster-audit-secs",
        "30",
    ])
    .cluster_settings()
    .unwrap()
    .expect("settings with --cluster-url");
    assert_eq!(settings.info.redis.password.as_deref(), Some("s3cret"));
    assert!(
        !settings.shown_url.contains("s3cret"),
        "{}",
        settings.shown_url
    );
    assert_eq!(settings.prefix, "site-a:");
    assert_eq!(settings.timeout, Duration::from_millis(1), "at least 1 ms");
    assert_eq!(
        settings.lease_ttl,
        Duration::from_millis(300),
        "at least 300 ms"
    );
    assert_eq!(settings.node_name, "n7");
    assert_eq!(settings.publish_queue, 1, "at least 1");
    assert_eq!(settings.stream_max_len, 64);
    assert_eq!(settings.audit_interval, Duration::from_secs(30));
    assert!(settings.tls_ca.is_none());

    let ca = dir.path().join("ca.pem");
    std::fs::write(
        &ca,
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let settings = config(&[
        "--cluster-url",
        "rediss://10.1.2.3:6380",
        "--cluster-tls-ca-file",
        ca.to_str().unwrap(),
    ])
    .cluster_settings()
    .unwrap()
    .expect("settings with --cluster-url");
    assert!(settings
        .tls_ca
        .is_some_and(|pem| pem.starts_with(b"-----BEGIN")));
}

#[test]
fn request_limits_default_from_the_message_size() {
    let stats = |args: &[&str]| {
        let mut stats = tunecache_proto::v1::StatsResponse::default();
        crate::report::FillStats::fill_stats(&config(args).request_limits().unwrap(), &mut stats);
        (stats.max_message_bytes, stats.max_request_bytes_per_uid)
    };
    assert_eq!(stats(&[]), (64 << 20, 256 << 20));
    assert_eq!(
        stats(&["--max-message-bytes", "1048576"]),
        (1 << 20, 4 << 20)
    );
    assert_eq!(
        stats(&[
            "--max-message-bytes",
            "1048576",
            "--max-request-bytes-per-uid",
            "1048576"
        ]),
        (1 << 20, 1 << 20)
    );
    let error = config(&["--max-request-bytes-per-uid", "1048576"])
        .request_limits()
        .err()
        .expect("a per-uid bound below the message size")
        .to_string();
    assert!(
        error.contains("--max-request-bytes-per-uid 1048576"),
        "{error}"
    );
    assert!(Config::try_parse_from(["tunecached", "--max-message-bytes", "4294967296"]).is_err());
}

#[test]
fn bad_cluster_flags_are_refused_by_name() {
    let error = |args: &[&str]| match config(args).cluster_settings() {
        Err(error) => error.to_string(),
        Ok(_) => panic!("{args:?} accepted"),
    };
    let bad_url = error(&["--cluster-url", "http://pw@example"]);
    assert!(bad_url.contains("--cluster-url"), "{bad_url}");
    assert!(
        !bad_url.contains("pw@example"),
        "the URL is not echoed: {bad_url}"
    );
    let bad_prefix = error(&["--cluster-url", "redis://h", "--cluster-prefix", "{a}"]);
    assert!(bad_prefix.contains("--cluster-prefix"), "{bad_prefix}");
    let no_file = error(&[
        "--cluster-url",
        "redis://h",
        "--cluster-password-file",
        "/nonexistent/tunecache-password",
    ]);
    assert!(no_file.contains("--cluster-password-file"), "{no_file}");
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("ca.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    let not_pem = not_pem.to_str().unwrap();
    let no_cert = error(&[
        "--cluster-url",
        "rediss://h",
        "--cluster-tls-ca-file",
        not_pem,
    ]);
    assert!(no_cert.contains("--cluster-tls-ca-file"), "{no_cert}");
    assert!(no_cert.contains("no PEM certificate"), "{no_cert}");
    let plain = error(&[
        "--cluster-url",
        "redis://h",
        "--cluster-tls-ca-file",
        not_pem,
    ]);
    assert!(plain.contains("needs a rediss://"), "{plain}");
}

#[test]
fn the_default_name_is_the_host_and_the_state_directory_id() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    let config = config(&["--state-dir", state]);
    let before = config.node_name();
    config.ensure_node_id().unwrap();
    let named = config.node_name();
    assert!(
        named.starts_with(&before) && named.len() == before.len() + 9,
        "{named}"
    );
    assert!(
        crate::model::names::check_node_name(&named).is_ok(),
        "{named}"
    );
    config.ensure_node_id().unwrap();
    assert_eq!(config.node_name(), named, "the id is kept");
    let other = tempfile::tempdir().unwrap();
    let other = config_in(other.path());
    other.ensure_node_id().unwrap();
    assert_ne!(
        other.node_name(),
        named,
        "another state directory, another name"
    );
}

#[test]
fn a_cluster_key_file_follows_the_shared_dir_key_files_rules() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.key");
    let with_key = |path: &std::path::Path| {
        config(&[
            "--cluster-url",
            "redis://127.0.0.1:6379",
            "--cluster-key-file",
            path.to_str().unwrap(),
        ])
        .cluster_settings()
    };
    std::fs::write(&path, "0123456789abcdef-cluster-key\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let refused = with_key(&path).err().expect("a readable key is refused");
    assert!(
        refused.to_string().contains("--cluster-key-file"),
        "{refused}"
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let settings = with_key(&path).unwrap().unwrap();
    let key = settings.key.expect("the key");
    // The line end is not part of the key.
    let tag = key.sign(&[b"x"]);
    let same = crate::model::shared_key::SharedKey::new(b"0123456789abcdef-cluster-key").unwrap();
    assert!(same.verifies(&[b"x"], &tag));
    std::fs::write(&path, "short\n").unwrap();
    assert!(with_key(&path).is_err());
    assert!(config(&["--cluster-url", "redis://127.0.0.1:6379"])
        .cluster_settings()
        .unwrap()
        .unwrap()
        .key
        .is_none());
}

fn config_in(dir: &std::path::Path) -> Config {
    config(&["--state-dir", dir.to_str().unwrap()])
}

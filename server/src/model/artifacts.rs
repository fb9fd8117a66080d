//! The artifacts a result names (`tunecache.v1.Result.artifacts`): kept in one canonical form,
//! the encoded field-6 records of `Result` in name order, so that a result's artifacts are
//! bytes the merge rule compares, the stored record copies and every node spells the same.

use prost::encoding::{decode_key, decode_varint, encode_key, encode_varint, WireType};
use prost::Message;
use tunecache_proto::v1;

/// Field number of `Result.artifacts`.
pub const ARTIFACTS_FIELD: u32 = 6;

/// A result's artifacts, owned: the field-6 records of `Result`, in name order (names are
/// unique within a result: `validate` refuses a repeated one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArtifactList {
    encoded: Box<[u8]>,
}

/// A result's artifacts, borrowed from wherever they are held: what the merge rule compares
/// (bytes; so one total order over whole results, artifacts included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ArtifactsView<'a> {
    encoded: &'a [u8],
}

/// One artifact, borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArtifactRef<'a> {
    pub name: &'a str,
    pub sha256: &'a str,
    pub size: u64,
}

impl ArtifactList {
    /// The canonical form of the artifacts as a request or a peer sent them: sorted by name
    /// (then digest and size, so that even an unvalidated list has one form).
    pub fn from_wire(mut artifacts: Vec<v1::Artifact>) -> ArtifactList {
        if artifacts.is_empty() {
            return ArtifactList::default();
        }
        artifacts.sort_by(|a, b| {
            (a.name.as_str(), a.sha256.as_str(), a.size).cmp(&(
                b.name.as_str(),
                b.sha256.as_str(),
                b.size,
            ))
        });
        let mut encoded = Vec::new();
        for artifact in &artifacts {
            encode_key(ARTIFACTS_FIELD, WireType::LengthDelimited, &mut encoded);
            encode_varint(artifact.encoded_len() as u64, &mut encoded);
            artifact.encode_raw(&mut encoded);
        }
        ArtifactList {
            encoded: encoded.into_boxed_slice(),
        }
    }

    pub fn view(&self) -> ArtifactsView<'_> {
        ArtifactsView {
            encoded: &self.encoded,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.encoded.is_empty()
    }
}

impl<'a> ArtifactsView<'a> {
    /// No artifacts (a `const`, for empty views).
    pub const fn new_empty() -> ArtifactsView<'static> {
        ArtifactsView { encoded: &[] }
    }

    /// The records as `put_record` copies them into a stored `Result`.
    pub fn encoded(&self) -> &'a [u8] {
        self.encoded
    }

    /// Reads the field-6 records at the end of a stored `Result` body; `None` if they are not
    /// a run of well-formed artifacts.
    pub fn parse(encoded: &'a [u8]) -> Option<ArtifactsView<'a>> {
        let view = ArtifactsView { encoded };
        let mut rest = encoded;
        while !rest.is_empty() {
            next_artifact(&mut rest)?;
        }
        Some(view)
    }

    pub fn is_empty(&self) -> bool {
        self.encoded.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = ArtifactRef<'a>> + 'a {
        let mut rest = self.encoded;
        std::iter::from_fn(move || next_artifact(&mut rest))
    }

    pub fn to_list(&self) -> ArtifactList {
        ArtifactList {
            encoded: self.encoded.into(),
        }
    }

    pub fn to_wire(&self) -> Vec<v1::Artifact> {
        self.iter()
            .map(|a| v1::Artifact {
                name: a.name.to_owned(),
                sha256: a.sha256.to_owned(),
                size: a.size,
            })
            .collect()
    }
}

/// Takes one field-6 record from the front of `rest`.
fn next_artifact<'a>(rest: &mut &'a [u8]) -> Option<ArtifactRef<'a>> {
    if rest.is_empty() {
        return None;
    }
    if decode_key(rest).ok()? != (ARTIFACTS_FIELD, WireType::LengthDelimited) {
        return None;
    }
    let len = usize::try_from(decode_varint(rest).ok()?).ok()?;
    let (mut body, tail) = rest.split_at_checked(len)?;
    *rest = tail;
    let mut artifact = ArtifactRef {
        name: "",
        sha256: "",
        size: 0,
    };
    while !body.is_empty() {
        match decode_key(&mut body).ok()? {
            (1, WireType::LengthDelimited) => artifact.name = take_str(&mut body)?,
            (2, WireType::LengthDelimited) => artifact.sha256 = take_str(&mut body)?,
            (3, WireType::Varint) => artifact.size = decode_varint(&mut body).ok()?,
            _ => return None,
        }
    }
    Some(artifact)
}

fn take_str<'a>(body: &mut &'a [u8]) -> Option<&'a str> {
    let len = usize::try_from(decode_varint(body).ok()?).ok()?;
    let (head, tail) = body.split_at_checked(len)?;
    *body = tail;
    std::str::from_utf8(head).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifact(name: &str, digest: char, size: u64) -> v1::Artifact {
        v1::Artifact {
            name: name.into(),
            sha256: digest.to_string().repeat(64),
            size,
        }
    }

    #[test]
    fn the_canonical_form_is_what_prost_writes_in_name_order() {
        let list = ArtifactList::from_wire(vec![
            artifact("wrapper_compiled.so", 'a', 1 << 20),
            artifact("mapping.json", 'b', 0),
            artifact("source.cu", 'c', 7),
        ]);
        let sorted = vec![
            artifact("mapping.json", 'b', 0),
            artifact("source.cu", 'c', 7),
            artifact("wrapper_compiled.so", 'a', 1 << 20),
        ];
        let expected = v1::Result {
            artifacts: sorted.clone(),
            ..Default::default()
        }
        .encode_to_vec();
        assert_eq!(list.view().encoded(), expected.as_slice());
        assert_eq!(list.view().to_wire(), sorted);
        assert_eq!(ArtifactsView::parse(&expected), Some(list.view()));
        let names: Vec<&str> = list.view().iter().map(|a| a.name).collect();
        assert_eq!(names, ["mapping.json", "source.cu", "wrapper_compiled.so"]);
        // Any order of the same artifacts is one form.
        let reversed = ArtifactList::from_wire(sorted.into_iter().rev().collect());
        assert_eq!(reversed, list);
        assert!(ArtifactList::from_wire(Vec::new()).is_empty());
    }

    #[test]
    fn parse_refuses_what_is_not_a_run_of_artifacts() {
        let list = ArtifactList::from_wire(vec![artifact("a", 'a', 3)]);
        let encoded = list.view().encoded();
        for len in 1..encoded.len() {
            assert_eq!(ArtifactsView::parse(&encoded[..len]), None, "{len}");
        }
        let mut other_field = encoded.to_vec();
        other_field[0] = (5 << 3) | 2;
        assert_eq!(ArtifactsView::parse(&other_field), None);
    }
}

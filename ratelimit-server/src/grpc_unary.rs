//! `ShouldRateLimit` framed by hand: the request's one gRPC message read
//! from the HTTP/2 body, decoded, decided, and the answer sent as one data
//! frame and a `grpc-status: 0` trailer.
//!
//! tonic's generic unary path (a streaming decoder and encoder, metadata
//! maps converted both ways, a boxed future the size of the call's state)
//! cost the service more CPU per request than its decision. This does the
//! same for the one unary method the service answers at volume, with
//! tonic's answers to bad input: a compressed message is `UNIMPLEMENTED`
//! (no compression is offered), a compressed flag without `grpc-encoding`
//! or a body cut short is `INTERNAL`, a message over the decoding limit
//! `OUT_OF_RANGE`, an undecodable one `INTERNAL`. A second message in the
//! call is `INTERNAL` too, as grpc-java answers it (tonic decided the
//! first and dropped the rest).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming, SizeHint};
use prost::Message;

use crate::service::{RateLimitService, ServiceError};

/// A gRPC message's prefix: the compressed flag and the length.
const PREFIX: usize = 5;

/// A gRPC answer's body: tonic's (the health service, trailers-only
/// statuses) or one message and its `grpc-status: 0` trailer.
#[derive(Debug)]
pub(crate) enum Reply {
    /// A body built by tonic.
    Tonic(tonic::body::Body),
    /// One framed message, then the trailer.
    Message {
        /// The framed message, until sent.
        data: Option<Bytes>,
        /// Whether the trailer is still to send.
        trailer: bool,
    },
}

impl hyper::body::Body for Reply {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        match self.get_mut() {
            Self::Tonic(b) => Pin::new(b).poll_frame(cx),
            Self::Message { data, trailer } => {
                if let Some(d) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(d))));
                }
                if std::mem::take(trailer) {
                    let mut t = http::HeaderMap::with_capacity(1);
                    t.insert("grpc-status", http::HeaderValue::from_static("0"));
                    return Poll::Ready(Some(Ok(Frame::trailers(t))));
                }
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Tonic(b) => b.is_end_stream(),
            Self::Message { data, trailer } => data.is_none() && !trailer,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Tonic(b) => b.size_hint(),
            Self::Message { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// A status as a trailers-only answer.
pub(crate) fn status(s: tonic::Status) -> http::Response<Reply> {
    s.into_http::<tonic::body::Body>().map(Reply::Tonic)
}

/// Answers one `ShouldRateLimit` call; `max` is the decoding limit, in
/// bytes.
pub(crate) async fn should_rate_limit(
    service: Arc<RateLimitService>,
    max: usize,
    req: http::Request<Incoming>,
) -> http::Response<Reply> {
    let message = match read_message(req, max).await {
        Ok(m) => m,
        Err(s) => return status(s),
    };
    let request = match RateLimitRequest::decode(message) {
        Ok(r) => r,
        Err(e) => return status(tonic::Status::internal(e.to_string())),
    };
    match service.should_rate_limit(&request).await {
        Ok(answer) => {
            let len = answer.encoded_len();
            let Ok(len32) = u32::try_from(len) else {
                return status(tonic::Status::internal("answer over 4 GiB"));
            };
            let mut framed = BytesMut::with_capacity(PREFIX + len);
            framed.put_u8(0);
            framed.put_u32(len32);
            // The buffer holds the encoded length: encoding cannot fail.
            if let Err(e) = answer.encode(&mut framed) {
                return status(tonic::Status::internal(e.to_string()));
            }
            let mut r = http::Response::new(Reply::Message {
                data: Some(framed.freeze()),
                trailer: true,
            });
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            r
        }
        Err(e) => status(status_of(e)),
    }
}

/// The request's one message, without its prefix.
async fn read_message(req: http::Request<Incoming>, max: usize) -> Result<Bytes, tonic::Status> {
    if let Some(enc) = req.headers().get("grpc-encoding")
        && enc.as_bytes() != b"identity"
    {
        return Err(tonic::Status::unimplemented(format!(
            "Content is compressed with `{}` which isn't supported",
            String::from_utf8_lossy(enc.as_bytes())
        )));
    }
    let mut body = req.into_body();
    // Most calls come in one data frame: kept as it is; more are joined.
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    let mut have = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| tonic::Status::internal(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            // Trailers from the client: nothing the service reads.
            continue;
        };
        have += data.len();
        if have > PREFIX + max {
            return Err(too_large(have - PREFIX, max));
        }
        match (&mut first, &mut joined) {
            (None, None) => first = Some(data),
            (Some(f), None) => {
                let mut j = BytesMut::with_capacity(have);
                j.extend_from_slice(f);
                j.extend_from_slice(&data);
                first = None;
                joined = Some(j);
            }
            (_, Some(j)) => j.extend_from_slice(&data),
        }
    }
    let mut all = match (first, joined) {
        (_, Some(j)) => j.freeze(),
        (Some(f), None) => f,
        (None, None) => Bytes::new(),
    };
    if all.is_empty() {
        return Err(tonic::Status::internal("Missing request message."));
    }
    if all.len() < PREFIX {
        return Err(tonic::Status::internal("Unexpected EOF decoding stream."));
    }
    match all.get_u8() {
        0 => {}
        1 => {
            return Err(tonic::Status::internal(
                "protocol error: received message with compressed-flag but no grpc-encoding was \
                 specified",
            ));
        }
        f => {
            return Err(tonic::Status::internal(format!(
                "protocol error: received message with invalid compression flag: {f} (valid \
                 flags are 0 and 1)"
            )));
        }
    }
    let len = all.get_u32() as usize;
    if len > max {
        return Err(too_large(len, max));
    }
    match all.len().cmp(&len) {
        std::cmp::Ordering::Less => Err(tonic::Status::internal("Unexpected EOF decoding stream.")),
        std::cmp::Ordering::Greater => Err(tonic::Status::internal(
            "more than one message in a unary call",
        )),
        std::cmp::Ordering::Equal => Ok(all),
    }
}

/// A refused request's gRPC status: `INVALID_ARGUMENT` for bad input,
/// `INTERNAL` otherwise.
fn status_of(e: ServiceError) -> tonic::Status {
    match e {
        ServiceError::Invalid(e) => tonic::Status::invalid_argument(e.to_string()),
        e => tonic::Status::internal(e.to_string()),
    }
}

/// The decoding limit's refusal.
fn too_large(len: usize, max: usize) -> tonic::Status {
    tonic::Status::out_of_range(format!(
        "Error, decoded message length too large: found {len} bytes, the limit is: {max} bytes"
    ))
}

//! Server reflection, v1 and v1alpha, over one descriptor pool: the
//! Events, health and reflection services and the typed ones. A request
//! that cannot be answered (an unknown symbol or file) gets an
//! `error_response` on the stream, which stays open for the next request,
//! as the reflection protocol says (tonic-reflection ends the stream).

use std::pin::Pin;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use prost::Message;
use prost_reflect::{DescriptorPool, EnumDescriptor, FileDescriptor};
use tonic::{Code, Request, Response, Status, Streaming};
use tonic_reflection::pb::{v1, v1alpha};
use v1::server_reflection_request::MessageRequest;
use v1::server_reflection_response::MessageResponse;

/// The descriptors reflection answers from.
pub(crate) struct Files {
    pool: DescriptorPool,
}

impl Files {
    /// A pool of the encoded `FileDescriptorSet`s; a file already added
    /// (a well-known type imported by several) is kept once.
    pub(crate) fn new(sets: &[&[u8]]) -> Result<Files, String> {
        let mut pool = DescriptorPool::new();
        for set in sets {
            let set = prost_reflect::prost_types::FileDescriptorSet::decode(*set)
                .map_err(|e| format!("a descriptor set does not decode: {e}"))?;
            for file in set.file {
                if pool.get_file_by_name(file.name()).is_some() {
                    continue;
                }
                let name = file.name().to_owned();
                pool.decode_file_descriptor_proto(file.encode_to_vec().as_slice())
                    .map_err(|e| format!("{name}: {e}"))?;
            }
        }
        Ok(Files { pool })
    }

    /// The file that defines `symbol`: a service, method, message, field,
    /// enum, enum value or extension, by its full name.
    fn file_of_symbol(&self, symbol: &str) -> Option<FileDescriptor> {
        let pool = &self.pool;
        if let Some(s) = pool.get_service_by_name(symbol) {
            return Some(s.parent_file());
        }
        if let Some(m) = pool.get_message_by_name(symbol) {
            return Some(m.parent_file());
        }
        if let Some(e) = pool.get_enum_by_name(symbol) {
            return Some(e.parent_file());
        }
        if let Some(x) = pool.get_extension_by_name(symbol) {
            return Some(x.parent_file());
        }
        let (parent, name) = symbol.rsplit_once('.')?;
        if let Some(s) = pool.get_service_by_name(parent) {
            return s.methods().any(|m| m.name() == name).then(|| s.parent_file());
        }
        if let Some(m) = pool.get_message_by_name(parent) {
            let member = m.get_field_by_name(name).is_some()
                || m.oneofs().any(|o| o.name() == name)
                // An enum's values are named in the enum's own scope.
                || has_value(m.child_enums(), name);
            return member.then(|| m.parent_file());
        }
        if let Some(e) = pool.get_enum_by_name(parent) {
            return e.get_value_by_name(name).map(|_| e.parent_file());
        }
        pool.files()
            .find(|f| f.package_name() == parent && has_value(f.enums(), name))
    }

    fn file_response(file: &FileDescriptor) -> MessageResponse {
        MessageResponse::FileDescriptorResponse(v1::FileDescriptorResponse {
            file_descriptor_proto: vec![file.encode_to_vec()],
        })
    }

    /// The answer to one request.
    fn answer(&self, request: v1::ServerReflectionRequest) -> v1::ServerReflectionResponse {
        let not_found = |what: String| {
            MessageResponse::ErrorResponse(v1::ErrorResponse {
                error_code: Code::NotFound as i32,
                error_message: what,
            })
        };
        let response = match &request.message_request {
            None => MessageResponse::ErrorResponse(v1::ErrorResponse {
                error_code: Code::InvalidArgument as i32,
                error_message: "the request names nothing to look up".to_owned(),
            }),
            Some(MessageRequest::ListServices(_)) => {
                MessageResponse::ListServicesResponse(v1::ListServiceResponse {
                    service: self
                        .pool
                        .services()
                        .map(|s| v1::ServiceResponse {
                            name: s.full_name().to_owned(),
                        })
                        .collect(),
                })
            }
            Some(MessageRequest::FileByFilename(name)) => match self.pool.get_file_by_name(name) {
                Some(file) => Self::file_response(&file),
                None => not_found(format!("no file `{name}`")),
            },
            Some(MessageRequest::FileContainingSymbol(symbol)) => match self.file_of_symbol(symbol) {
                Some(file) => Self::file_response(&file),
                None => not_found(format!("no symbol `{symbol}`")),
            },
            Some(MessageRequest::FileContainingExtension(x)) => {
                let file = self
                    .pool
                    .get_message_by_name(&x.containing_type)
                    .and_then(|m| {
                        m.extensions()
                            .find(|e| i64::from(e.number()) == i64::from(x.extension_number))
                    })
                    .map(|e| e.parent_file());
                match file {
                    Some(file) => Self::file_response(&file),
                    None => not_found(format!(
                        "no extension {} of `{}`",
                        x.extension_number, x.containing_type
                    )),
                }
            }
            Some(MessageRequest::AllExtensionNumbersOfType(name)) => {
                match self.pool.get_message_by_name(name) {
                    Some(m) => MessageResponse::AllExtensionNumbersResponse(v1::ExtensionNumberResponse {
                        base_type_name: name.clone(),
                        extension_number: m.extensions().map(|e| e.number() as i32).collect(),
                    }),
                    None => not_found(format!("no message type `{name}`")),
                }
            }
        };
        v1::ServerReflectionResponse {
            valid_host: request.host.clone(),
            original_request: Some(request),
            message_response: Some(response),
        }
    }
}

/// Whether one of `enums` has a value `name`.
fn has_value(enums: impl IntoIterator<Item = EnumDescriptor>, name: &str) -> bool {
    enums.into_iter().any(|e| e.get_value_by_name(name).is_some())
}

type Answers<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The reflection services of both versions, answering from `files`.
#[derive(Clone)]
pub(crate) struct Reflection {
    files: Arc<Files>,
}

impl Reflection {
    pub(crate) fn new(files: Files) -> Reflection {
        Reflection {
            files: Arc::new(files),
        }
    }
}

#[tonic::async_trait]
impl v1::server_reflection_server::ServerReflection for Reflection {
    type ServerReflectionInfoStream = Answers<v1::ServerReflectionResponse>;

    async fn server_reflection_info(
        &self,
        request: Request<Streaming<v1::ServerReflectionRequest>>,
    ) -> Result<Response<Answers<v1::ServerReflectionResponse>>, Status> {
        let files = self.files.clone();
        let answers = request.into_inner().map(move |r| r.map(|r| files.answer(r)));
        Ok(Response::new(Box::pin(answers)))
    }
}

/// A message as the same message of the other version: v1alpha and v1
/// have the same fields under the same numbers.
fn convert<A: Message, B: Message + Default>(a: &A) -> Result<B, Status> {
    B::decode(a.encode_to_vec().as_slice()).map_err(|e| Status::internal(format!("reflection v1alpha: {e}")))
}

#[tonic::async_trait]
impl v1alpha::server_reflection_server::ServerReflection for Reflection {
    type ServerReflectionInfoStream = Answers<v1alpha::ServerReflectionResponse>;

    async fn server_reflection_info(
        &self,
        request: Request<Streaming<v1alpha::ServerReflectionRequest>>,
    ) -> Result<Response<Answers<v1alpha::ServerReflectionResponse>>, Status> {
        let files = self.files.clone();
        let answers = request.into_inner().map(move |r| {
            let request: v1::ServerReflectionRequest = convert(&r?)?;
            convert(&files.answer(request))
        });
        Ok(Response::new(Box::pin(answers)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_resolve_to_their_files_and_unknown_ones_do_not() {
        let files = Files::new(&[
            switchyard_proto::grpc::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            v1::FILE_DESCRIPTOR_SET,
            v1alpha::FILE_DESCRIPTOR_SET,
        ])
        .unwrap();
        for symbol in [
            "switchyard.v1.Events",
            "switchyard.v1.Events.Call",
            "switchyard.v1.CallRequest",
            "switchyard.v1.CallRequest.payload",
            "grpc.health.v1.HealthCheckResponse.ServingStatus",
            "grpc.health.v1.HealthCheckResponse.SERVING",
        ] {
            assert!(files.file_of_symbol(symbol).is_some(), "{symbol}");
        }
        for symbol in ["switchyard.v1.Nope", "switchyard.v1.Events.Nope", "nope", ""] {
            assert!(files.file_of_symbol(symbol).is_none(), "{symbol}");
        }
    }
}

// Package iam is the sidecar's access control, in Google Pub/Sub's model:
// callers are authenticated (mutual TLS, bearer tokens from a file, or JWTs
// checked against a JWKS file) as IAM principals ("user:…",
// "serviceAccount:…"), and each call is authorized against IAM policies
// that grant Pub/Sub's predefined roles.
//
// A resource's effective policy is the union of the project-level policy
// (from a file, for every project or per project) and the resource's own
// policy, which the google.iam.v1.IAMPolicy service sets and JetStream
// keeps. Each gRPC method needs the permissions Google's access control
// table names for it (methods.go); the REST and HTTP routes check the same
// permissions through the request message of the method they serve.
//
// A nil *Guard allows everything: the sidecar without authentication
// configured behaves as it did before access control. It still serves the
// IAMPolicy service (OpenService): policies are kept and returned as with
// access control, and enforce nothing.
//
// Members are user:ID, serviceAccount:ID, domain:DOMAIN (every user and
// service account whose address is in DOMAIN), allUsers and
// allAuthenticatedUsers; groups are refused, as the sidecar has no
// directory to resolve them.
package iam

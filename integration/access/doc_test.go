// Package access tests the sidecar's access control through the clients
// users run: Google's Go client with a token over TLS and with a client
// certificate, raw gRPC, REST with curl's requests, Node's client and
// gcloud; and the role × method table of Google's permissions over both
// ports.
package access

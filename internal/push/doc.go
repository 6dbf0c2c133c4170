// Package push holds the building blocks of push subscriptions: the
// sidecar POSTs each message of a subscription that has a
// push_config.push_endpoint to the application, as Google Cloud Pub/Sub
// does, and acks or nacks it from the HTTP outcome.
//
// What it has:
//
//   - AllowList, parsed from the sidecar's --push-allow flag: which hosts a
//     push endpoint may name (Check, at subscription create/update time) and
//     which addresses the sender may connect to (at dial time, so that a
//     name that resolves to a disallowed address is refused too).
//   - NewRequest, which builds the HTTP request Pub/Sub would send for a
//     message: the JSON wrapper (the default), the unwrapped body
//     (NoWrapper, with or without metadata headers), or a CloudEvents
//     binary-mode request.
//   - Client, which sends one request with the caller's timeout (the
//     subscription's ack deadline), follows no redirects, reads at most a few
//     KiB of the response, and classifies the outcome as a Result: acked, or
//     nacked with a Reason.
//   - Backoff, the exponential delay before the next attempt for a key.
//
// The runner that uses them is in internal/pubsubapi/pushsubs.go: it takes
// messages from the subscription's dispatcher, keeps one request in flight
// per ordering key, applies Backoff to nacks when the subscription has no
// retry policy, and leaves the dead-letter policy to the adapter. Nothing
// in this package starts a goroutine.
package push

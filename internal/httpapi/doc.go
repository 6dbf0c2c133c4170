// Package httpapi is the sidecar's HTTP API: Google Pub/Sub's REST API
// (publishing always; topics, subscriptions and snapshots when
// Config.PubSub is set, schemas when Config.Schemas is too), publishing CloudEvents over the CloudEvents HTTP
// binding, the health and metrics endpoints, and the status page.
//
// Routes (docs/HTTP.md has the request and response shapes):
//
//	POST /v1/projects/{project}/topics/{topic}:publish   Pub/Sub REST publish
//	POST /v1/topics/{topic}:publish                      the same, in Config.DefaultProject
//	POST /v1/projects/{project}/topics/{topic}/events    one CloudEvent, binary or structured mode, or a batch
//	POST /v1/topics/{topic}/events                       the same, in Config.DefaultProject
//	OPTIONS on both /events routes                       CloudEvents webhook validation (WebHook-Request-Origin)
//	GET  /v1/projects/{project}/subscriptions/{subscription}/didcomm/threads/{thread}
//	                                                     a DIDComm thread's received_orders
//	GET  /v1/subscriptions/{subscription}/didcomm/threads/{thread}
//	                                                     the same, in Config.DefaultProject
//	GET  /healthz                                        200 while the process serves
//	GET  /readyz                                         200 when Config.Ready returns nil, else 503
//	GET  /metrics                                        Prometheus metrics, text format by default
//	GET  /                                               the status page (with Config.Status; its files under /status/)
//	GET  /v1/status                                      the sidecar's status as JSON (with Config.Status)
//
// With Config.PubSub, the rest of Pub/Sub's REST API (rest.go), each route
// decoded as its google.api.http rule says and served by the PubSub method
// of the same name:
//
//	PUT|GET|PATCH|DELETE /v1/projects/{project}/topics/{topic}                 CreateTopic, GetTopic, UpdateTopic, DeleteTopic
//	GET  /v1/projects/{project}/topics                                         ListTopics
//	GET  /v1/projects/{project}/topics/{topic}/subscriptions                   ListTopicSubscriptions
//	GET  /v1/projects/{project}/topics/{topic}/snapshots                       ListTopicSnapshots
//	PUT|GET|PATCH|DELETE /v1/projects/{project}/subscriptions/{subscription}   CreateSubscription, GetSubscription, UpdateSubscription, DeleteSubscription
//	GET  /v1/projects/{project}/subscriptions                                  ListSubscriptions
//	POST /v1/projects/{project}/subscriptions/{subscription}:{verb}            pull, acknowledge, modifyAckDeadline, modifyPushConfig, seek, detach
//	PUT|GET|PATCH|DELETE /v1/projects/{project}/snapshots/{snapshot}           CreateSnapshot, GetSnapshot, UpdateSnapshot, DeleteSnapshot
//	GET  /v1/projects/{project}/snapshots                                      ListSnapshots
//	POST|GET /v1/projects/{project}/schemas                                    CreateSchema (?schemaId=), ListSchemas
//	GET|DELETE /v1/projects/{project}/schemas/{schema}                         GetSchema, DeleteSchema
//	POST|GET|DELETE /v1/projects/{project}/schemas/{schema}:{verb}             commit, rollback (POST); listRevisions (GET); deleteRevision (DELETE)
//	POST /v1/projects/{project}/schemas:{verb}                                 validate, validateMessage
//
// Both publish routes answer only once every message is stored, and refuse a
// request whole when any message in it is invalid. Errors are JSON in the
// shape of Google's REST errors:
//
//	{"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "Ordering key cannot be empty"}}
package httpapi

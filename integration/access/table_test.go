package access

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/iam/apiv1/iampb"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetorder/jetorder/internal/iam"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
)

// The role × method table: every method of Publisher, Subscriber,
// SchemaService and IAMPolicy, called by every role of itest.AccessRoles
// (and by a caller without credentials) over gRPC and over the REST API,
// must be allowed exactly when the role holds every permission Google's
// access control table (cloud.google.com/pubsub/docs/access-control)
// names for it.

// deniedText is Google's message of PERMISSION_DENIED.
const deniedText = "User not authorized to perform this action."

// anonymous is the caller that sends no credentials.
const anonymous = "anonymous"

// The fixtures, created by the admin; calls that would destroy something
// name ids that do not exist (tblMissing), and calls that create something
// name ids unique to the port and the role.
const (
	tblTopic   = "tbl-topic"
	tblSub     = "tbl-sub"
	tblSnap    = "tbl-snap"
	tblSchema  = "tbl-schema"
	tblMissing = "tbl-missing"
	// madeUpAckID and madeUpRevision name nothing the sidecar gave.
	madeUpAckID    = "made-up-ack-id"
	madeUpRevision = "0badc0de"
)

const tblProject = "projects/" + itest.Project

func snapPath(id string) string   { return tblProject + "/snapshots/" + id }
func schemaPath(id string) string { return tblProject + "/schemas/" + id }

const avroDefinition = `{"type":"record","name":"Rec","fields":[{"name":"a","type":"string"}]}`

// Google's permissions, as its access control table names them: written
// here, not taken from internal/iam, so that the table checks the
// sidecar's rules rather than repeating them.
const (
	pTopicsCreate             = "pubsub.topics.create"
	pTopicsUpdate             = "pubsub.topics.update"
	pTopicsPublish            = "pubsub.topics.publish"
	pTopicsGet                = "pubsub.topics.get"
	pTopicsList               = "pubsub.topics.list"
	pTopicsDelete             = "pubsub.topics.delete"
	pTopicsAttachSubscription = "pubsub.topics.attachSubscription"
	pTopicsDetachSubscription = "pubsub.topics.detachSubscription"
	pSubscriptionsCreate      = "pubsub.subscriptions.create"
	pSubscriptionsGet         = "pubsub.subscriptions.get"
	pSubscriptionsUpdate      = "pubsub.subscriptions.update"
	pSubscriptionsList        = "pubsub.subscriptions.list"
	pSubscriptionsDelete      = "pubsub.subscriptions.delete"
	pSubscriptionsConsume     = "pubsub.subscriptions.consume"
	pSnapshotsCreate          = "pubsub.snapshots.create"
	pSnapshotsGet             = "pubsub.snapshots.get"
	pSnapshotsList            = "pubsub.snapshots.list"
	pSnapshotsUpdate          = "pubsub.snapshots.update"
	pSnapshotsDelete          = "pubsub.snapshots.delete"
	pSnapshotsSeek            = "pubsub.snapshots.seek"
	pSchemasCreate            = "pubsub.schemas.create"
	pSchemasGet               = "pubsub.schemas.get"
	pSchemasList              = "pubsub.schemas.list"
	pSchemasListRevisions     = "pubsub.schemas.listRevisions"
	pSchemasCommit            = "pubsub.schemas.commit"
	pSchemasRollback          = "pubsub.schemas.rollback"
	pSchemasDelete            = "pubsub.schemas.delete"
	pSchemasValidate          = "pubsub.schemas.validate"
)

type tableClients struct {
	pub pb.PublisherClient
	sub pb.SubscriberClient
	sch pb.SchemaServiceClient
	iam iampb.IAMPolicyClient
}

// restCall is one call of Google's REST API; path follows /v1/.
type restCall struct{ method, path, body string }

// row is one way to call a method, with the permissions Google's table
// gives it.
type row struct {
	// variant tells the rows of one method apart ("" when it has one).
	variant string
	perms   []string
	// grpc makes the call as role; rest is the same call through the REST
	// API. rest is nil only for a method Google's REST API has no route
	// for (noREST says why).
	grpc   func(ctx context.Context, c tableClients, role string) error
	rest   func(role string) restCall
	noREST string
	// ok, when set, are the only codes an allowed call may end with.
	ok []codes.Code
	// waits: an allowed call waits for messages, so it gets a short
	// deadline (a refused one gets the usual, so that its answer comes).
	waits bool
}

func labelsMask() *fieldmaskpb.FieldMask { return &fieldmaskpb.FieldMask{Paths: []string{"labels"}} }

// unique is an id for what role creates through port ("g" or "r").
func unique(prefix, port, role string) string { return prefix + "-" + port + "-" + role }

func js(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func methodName(svc protoreflect.FullName, m string) protoreflect.FullName {
	return svc.Append(protoreflect.Name(m))
}

// fixtures is what the calls need to know of the fixtures.
type fixtures struct {
	// subLabels are the subscription's labels: an update of its labels
	// keeps those the sidecar set at creation (jetorder-delivery), which
	// cannot change.
	subLabels map[string]string
	// firstRevision is the schema's first revision.
	firstRevision string
}

// withLabel is labels and k=v.
func withLabel(labels map[string]string, k, v string) map[string]string {
	out := maps.Clone(labels)
	if out == nil {
		out = map[string]string{}
	}
	out[k] = v
	return out
}

// permissionTable is Google's table of the permissions each method needs,
// with a call of each on the fixtures.
func permissionTable(fx fixtures) map[protoreflect.FullName][]row {
	const (
		publisher  = protoreflect.FullName("google.pubsub.v1.Publisher")
		subscriber = protoreflect.FullName("google.pubsub.v1.Subscriber")
		schemas    = protoreflect.FullName("google.pubsub.v1.SchemaService")
		policies   = protoreflect.FullName("google.iam.v1.IAMPolicy")
	)
	ok := []codes.Code{codes.OK}
	notFound := []codes.Code{codes.NotFound}
	avro := &pb.Schema{Type: pb.Schema_AVRO, Definition: avroDefinition}
	avroJSON := map[string]string{"type": "AVRO", "definition": avroDefinition}
	validMessage := []byte(`{"a":"x"}`)
	seekTime := time.Now().Add(-time.Hour).UTC()

	t := map[protoreflect.FullName][]row{
		// Publisher: projects.topics.* and projects.subscriptions.detach.
		methodName(publisher, "CreateTopic"): {{
			perms: []string{pTopicsCreate}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, role string) error {
				_, err := c.pub.CreateTopic(ctx, &pb.Topic{Name: topicPath(unique("new-topic", "g", role))})
				return err
			},
			rest: func(role string) restCall {
				return restCall{"PUT", tblProject + "/topics/" + unique("new-topic", "r", role), `{}`}
			},
		}},
		methodName(publisher, "UpdateTopic"): {{
			perms: []string{pTopicsUpdate}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, role string) error {
				_, err := c.pub.UpdateTopic(ctx, &pb.UpdateTopicRequest{
					Topic: &pb.Topic{Name: topicPath(tblTopic), Labels: map[string]string{"by": role}}, UpdateMask: labelsMask()})
				return err
			},
			rest: func(role string) restCall {
				return restCall{"PATCH", tblProject + "/topics/" + tblTopic,
					js(map[string]any{"topic": map[string]any{"labels": map[string]string{"by": role}}, "updateMask": "labels"})}
			},
		}},
		methodName(publisher, "Publish"): {{
			perms: []string{pTopicsPublish}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, role string) error {
				_, err := c.pub.Publish(ctx, &pb.PublishRequest{Topic: topicPath(tblTopic), Messages: []*pb.PubsubMessage{{Data: []byte(role)}}})
				return err
			},
			rest: func(role string) restCall {
				return restCall{"POST", tblProject + "/topics/" + tblTopic + ":publish",
					js(map[string]any{"messages": []map[string]string{{"data": base64.StdEncoding.EncodeToString([]byte(role))}}})}
			},
		}},
		methodName(publisher, "GetTopic"): {{
			perms: []string{pTopicsGet}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.pub.GetTopic(ctx, &pb.GetTopicRequest{Topic: topicPath(tblTopic)})
				return err
			},
			rest: func(string) restCall { return restCall{"GET", tblProject + "/topics/" + tblTopic, ""} },
		}},
		methodName(publisher, "ListTopics"): {{
			perms: []string{pTopicsList}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.pub.ListTopics(ctx, &pb.ListTopicsRequest{Project: tblProject})
				return err
			},
			rest: func(string) restCall { return restCall{"GET", tblProject + "/topics", ""} },
		}},
		methodName(publisher, "ListTopicSubscriptions"): {{
			perms: []string{pTopicsGet}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.pub.ListTopicSubscriptions(ctx, &pb.ListTopicSubscriptionsRequest{Topic: topicPath(tblTopic)})
				return err
			},
			rest: func(string) restCall {
				return restCall{"GET", tblProject + "/topics/" + tblTopic + "/subscriptions", ""}
			},
		}},
		// The sidecar does not serve ListTopicSnapshots (UNIMPLEMENTED,
		// docs/HTTP.md), after its permission check.
		methodName(publisher, "ListTopicSnapshots"): {{
			perms: []string{pTopicsGet}, ok: []codes.Code{codes.OK, codes.Unimplemented},
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.pub.ListTopicSnapshots(ctx, &pb.ListTopicSnapshotsRequest{Topic: topicPath(tblTopic)})
				return err
			},
			rest: func(string) restCall { return restCall{"GET", tblProject + "/topics/" + tblTopic + "/snapshots", ""} },
		}},
		methodName(publisher, "DeleteTopic"): {{
			perms: []string{pTopicsDelete}, ok: notFound,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.pub.DeleteTopic(ctx, &pb.DeleteTopicRequest{Topic: topicPath(tblMissing)})
				return err
			},
			rest: func(string) restCall { return restCall{"DELETE", tblProject + "/topics/" + tblMissing, ""} },
		}},
		// On the subscription's topic; a subscription that does not exist
		// has none, and the project stands for it.
		methodName(publisher, "DetachSubscription"): {{
			perms: []string{pTopicsDetachSubscription}, ok: notFound,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.pub.DetachSubscription(ctx, &pb.DetachSubscriptionRequest{Subscription: subPath(tblMissing)})
				return err
			},
			rest: func(string) restCall {
				return restCall{"POST", tblProject + "/subscriptions/" + tblMissing + ":detach", ""}
			},
		}},

		// Subscriber: projects.subscriptions.* and projects.snapshots.*.
		methodName(subscriber, "CreateSubscription"): {{
			perms: []string{pSubscriptionsCreate, pTopicsAttachSubscription}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, role string) error {
				_, err := c.sub.CreateSubscription(ctx, &pb.Subscription{Name: subPath(unique("new-sub", "g", role)), Topic: topicPath(tblTopic)})
				return err
			},
			rest: func(role string) restCall {
				return restCall{"PUT", tblProject + "/subscriptions/" + unique("new-sub", "r", role), js(map[string]string{"topic": topicPath(tblTopic)})}
			},
		}},
		methodName(subscriber, "GetSubscription"): {{
			perms: []string{pSubscriptionsGet}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sub.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: subPath(tblSub)})
				return err
			},
			rest: func(string) restCall { return restCall{"GET", tblProject + "/subscriptions/" + tblSub, ""} },
		}},
		methodName(subscriber, "UpdateSubscription"): {{
			perms: []string{pSubscriptionsUpdate}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, role string) error {
				_, err := c.sub.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
					Subscription: &pb.Subscription{Name: subPath(tblSub), Labels: withLabel(fx.subLabels, "by", role)}, UpdateMask: labelsMask()})
				return err
			},
			rest: func(role string) restCall {
				return restCall{"PATCH", tblProject + "/subscriptions/" + tblSub,
					js(map[string]any{"subscription": map[string]any{"labels": withLabel(fx.subLabels, "by", role)}, "updateMask": "labels"})}
			},
		}},
		methodName(subscriber, "ListSubscriptions"): {{
			perms: []string{pSubscriptionsList}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sub.ListSubscriptions(ctx, &pb.ListSubscriptionsRequest{Project: tblProject})
				return err
			},
			rest: func(string) restCall { return restCall{"GET", tblProject + "/subscriptions", ""} },
		}},
		methodName(subscriber, "DeleteSubscription"): {{
			perms: []string{pSubscriptionsDelete}, ok: notFound,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sub.DeleteSubscription(ctx, &pb.DeleteSubscriptionRequest{Subscription: subPath(tblMissing)})
				return err
			},
			rest: func(string) restCall { return restCall{"DELETE", tblProject + "/subscriptions/" + tblMissing, ""} },
		}},
		methodName(subscriber, "ModifyAckDeadline"): {{
			perms: []string{pSubscriptionsConsume}, ok: []codes.Code{codes.InvalidArgument, codes.OK},
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sub.ModifyAckDeadline(ctx, &pb.ModifyAckDeadlineRequest{Subscription: subPath(tblSub), AckIds: []string{madeUpAckID}, AckDeadlineSeconds: 10})
				return err
			},
			rest: func(string) restCall {
				return restCall{"POST", tblProject + "/subscriptions/" + tblSub + ":modifyAckDeadline", js(map[string]any{"ackIds": []string{madeUpAckID}, "ackDeadlineSeconds": 10})}
			},
		}},
		methodName(subscriber, "Acknowledge"): {{
			perms: []string{pSubscriptionsConsume}, ok: []codes.Code{codes.InvalidArgument, codes.OK},
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sub.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: subPath(tblSub), AckIds: []string{madeUpAckID}})
				return err
			},
			rest: func(string) restCall {
				return restCall{"POST", tblProject + "/subscriptions/" + tblSub + ":acknowledge", js(map[string]any{"ackIds": []string{madeUpAckID}})}
			},
		}},
		methodName(subscriber, "Pull"): {{
			perms: []string{pSubscriptionsConsume}, ok: []codes.Code{codes.OK, codes.DeadlineExceeded}, waits: true,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sub.Pull(ctx, &pb.PullRequest{Subscription: subPath(tblSub), MaxMessages: 1, ReturnImmediately: true})
				return err
			},
			rest: func(string) restCall {
				return restCall{"POST", tblProject + "/subscriptions/" + tblSub + ":pull", `{"maxMessages":1,"returnImmediately":true}`}
			},
		}},
		// The stream is authorized on its first request; an allowed one
		// then waits for messages until its deadline (or gets one that a
		// publish of this table left).
		methodName(subscriber, "StreamingPull"): {{
			perms: []string{pSubscriptionsConsume}, ok: []codes.Code{codes.DeadlineExceeded, codes.Canceled, codes.OK}, waits: true,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				st, err := c.sub.StreamingPull(ctx)
				if err != nil {
					return err
				}
				if err := st.Send(&pb.StreamingPullRequest{Subscription: subPath(tblSub), StreamAckDeadlineSeconds: 10}); err != nil && err != io.EOF {
					return err
				}
				_, err = st.Recv()
				return err
			},
			noREST: "StreamingPull has no REST route",
		}},
		methodName(subscriber, "ModifyPushConfig"): {{
			perms: []string{pSubscriptionsUpdate}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sub.ModifyPushConfig(ctx, &pb.ModifyPushConfigRequest{Subscription: subPath(tblSub), PushConfig: &pb.PushConfig{}})
				return err
			},
			rest: func(string) restCall {
				return restCall{"POST", tblProject + "/subscriptions/" + tblSub + ":modifyPushConfig", `{"pushConfig":{}}`}
			},
		}},
		methodName(subscriber, "GetSnapshot"): {{
			perms: []string{pSnapshotsGet}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sub.GetSnapshot(ctx, &pb.GetSnapshotRequest{Snapshot: snapPath(tblSnap)})
				return err
			},
			rest: func(string) restCall { return restCall{"GET", tblProject + "/snapshots/" + tblSnap, ""} },
		}},
		methodName(subscriber, "ListSnapshots"): {{
			perms: []string{pSnapshotsList}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sub.ListSnapshots(ctx, &pb.ListSnapshotsRequest{Project: tblProject})
				return err
			},
			rest: func(string) restCall { return restCall{"GET", tblProject + "/snapshots", ""} },
		}},
		methodName(subscriber, "CreateSnapshot"): {{
			perms: []string{pSnapshotsCreate, pSubscriptionsConsume}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, role string) error {
				_, err := c.sub.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: snapPath(unique("new-snap", "g", role)), Subscription: subPath(tblSub)})
				return err
			},
			rest: func(role string) restCall {
				return restCall{"PUT", tblProject + "/snapshots/" + unique("new-snap", "r", role), js(map[string]string{"subscription": subPath(tblSub)})}
			},
		}, {
			variant: "unnamed", // named by the sidecar in the subscription's project
			perms:   []string{pSnapshotsCreate, pSubscriptionsConsume}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sub.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Subscription: subPath(tblSub)})
				return err
			},
			noREST: "REST names the snapshot in its path",
		}},
		methodName(subscriber, "UpdateSnapshot"): {{
			perms: []string{pSnapshotsUpdate}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, role string) error {
				_, err := c.sub.UpdateSnapshot(ctx, &pb.UpdateSnapshotRequest{
					Snapshot: &pb.Snapshot{Name: snapPath(tblSnap), Labels: map[string]string{"by": role}}, UpdateMask: labelsMask()})
				return err
			},
			rest: func(role string) restCall {
				return restCall{"PATCH", tblProject + "/snapshots/" + tblSnap,
					js(map[string]any{"snapshot": map[string]any{"labels": map[string]string{"by": role}}, "updateMask": "labels"})}
			},
		}},
		methodName(subscriber, "DeleteSnapshot"): {{
			perms: []string{pSnapshotsDelete}, ok: notFound,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sub.DeleteSnapshot(ctx, &pb.DeleteSnapshotRequest{Snapshot: snapPath(tblMissing)})
				return err
			},
			rest: func(string) restCall { return restCall{"DELETE", tblProject + "/snapshots/" + tblMissing, ""} },
		}},
		methodName(subscriber, "Seek"): {{
			variant: "time", perms: []string{pSubscriptionsConsume}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sub.Seek(ctx, &pb.SeekRequest{Subscription: subPath(tblSub), Target: &pb.SeekRequest_Time{Time: timestamppb.New(seekTime)}})
				return err
			},
			rest: func(string) restCall {
				return restCall{"POST", tblProject + "/subscriptions/" + tblSub + ":seek", js(map[string]string{"time": seekTime.Format(time.RFC3339)})}
			},
		}, {
			variant: "snapshot", perms: []string{pSubscriptionsConsume, pSnapshotsSeek}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sub.Seek(ctx, &pb.SeekRequest{Subscription: subPath(tblSub), Target: &pb.SeekRequest_Snapshot{Snapshot: snapPath(tblSnap)}})
				return err
			},
			rest: func(string) restCall {
				return restCall{"POST", tblProject + "/subscriptions/" + tblSub + ":seek", js(map[string]string{"snapshot": snapPath(tblSnap)})}
			},
		}},

		// SchemaService: projects.schemas.*.
		methodName(schemas, "CreateSchema"): {{
			perms: []string{pSchemasCreate}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, role string) error {
				_, err := c.sch.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: tblProject, SchemaId: unique("new-schema", "g", role), Schema: avro})
				return err
			},
			rest: func(role string) restCall {
				return restCall{"POST", tblProject + "/schemas?schemaId=" + unique("new-schema", "r", role), js(avroJSON)}
			},
		}},
		methodName(schemas, "GetSchema"): {{
			perms: []string{pSchemasGet}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sch.GetSchema(ctx, &pb.GetSchemaRequest{Name: schemaPath(tblSchema)})
				return err
			},
			rest: func(string) restCall { return restCall{"GET", tblProject + "/schemas/" + tblSchema, ""} },
		}},
		methodName(schemas, "ListSchemas"): {{
			perms: []string{pSchemasList}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sch.ListSchemas(ctx, &pb.ListSchemasRequest{Parent: tblProject})
				return err
			},
			rest: func(string) restCall { return restCall{"GET", tblProject + "/schemas", ""} },
		}},
		methodName(schemas, "ListSchemaRevisions"): {{
			perms: []string{pSchemasListRevisions}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sch.ListSchemaRevisions(ctx, &pb.ListSchemaRevisionsRequest{Name: schemaPath(tblSchema)})
				return err
			},
			rest: func(string) restCall {
				return restCall{"GET", tblProject + "/schemas/" + tblSchema + ":listRevisions", ""}
			},
		}},
		methodName(schemas, "CommitSchema"): {{
			perms: []string{pSchemasCommit}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sch.CommitSchema(ctx, &pb.CommitSchemaRequest{Name: schemaPath(tblSchema), Schema: avro})
				return err
			},
			rest: func(string) restCall {
				return restCall{"POST", tblProject + "/schemas/" + tblSchema + ":commit", js(map[string]any{"schema": avroJSON})}
			},
		}},
		methodName(schemas, "RollbackSchema"): {{
			perms: []string{pSchemasRollback}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sch.RollbackSchema(ctx, &pb.RollbackSchemaRequest{Name: schemaPath(tblSchema), RevisionId: fx.firstRevision})
				return err
			},
			rest: func(string) restCall {
				return restCall{"POST", tblProject + "/schemas/" + tblSchema + ":rollback", js(map[string]string{"revisionId": fx.firstRevision})}
			},
		}},
		// "Delete a schema or a schema revision: pubsub.schemas.delete".
		methodName(schemas, "DeleteSchemaRevision"): {{
			perms: []string{pSchemasDelete}, ok: notFound,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sch.DeleteSchemaRevision(ctx, &pb.DeleteSchemaRevisionRequest{Name: schemaPath(tblSchema) + "@" + madeUpRevision})
				return err
			},
			rest: func(string) restCall {
				return restCall{"DELETE", tblProject + "/schemas/" + tblSchema + ":deleteRevision?revisionId=" + madeUpRevision, ""}
			},
		}},
		methodName(schemas, "DeleteSchema"): {{
			perms: []string{pSchemasDelete}, ok: notFound,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sch.DeleteSchema(ctx, &pb.DeleteSchemaRequest{Name: schemaPath(tblMissing)})
				return err
			},
			rest: func(string) restCall { return restCall{"DELETE", tblProject + "/schemas/" + tblMissing, ""} },
		}},
		methodName(schemas, "ValidateSchema"): {{
			perms: []string{pSchemasValidate}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sch.ValidateSchema(ctx, &pb.ValidateSchemaRequest{Parent: tblProject, Schema: avro})
				return err
			},
			rest: func(string) restCall {
				return restCall{"POST", tblProject + "/schemas:validate", js(map[string]any{"schema": avroJSON})}
			},
		}},
		methodName(schemas, "ValidateMessage"): {{
			perms: []string{pSchemasValidate}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.sch.ValidateMessage(ctx, &pb.ValidateMessageRequest{Parent: tblProject,
					SchemaSpec: &pb.ValidateMessageRequest_Name{Name: schemaPath(tblSchema)}, Message: validMessage, Encoding: pb.Encoding_JSON})
				return err
			},
			rest: func(string) restCall {
				return restCall{"POST", tblProject + "/schemas:validateMessage", js(map[string]string{
					"name": schemaPath(tblSchema), "message": base64.StdEncoding.EncodeToString(validMessage), "encoding": "JSON"})}
			},
		}},
	}

	// IAMPolicy, on each kind of resource: {kind}.getIamPolicy and
	// {kind}.setIamPolicy on the resource; testIamPermissions needs none.
	for _, r := range []struct{ kind, id string }{
		{"topics", tblTopic}, {"subscriptions", tblSub}, {"snapshots", tblSnap}, {"schemas", tblSchema},
	} {
		resource := tblProject + "/" + r.kind + "/" + r.id
		variant := strings.TrimSuffix(r.kind, "s")
		// What TestIamPermissions asks: a permission of most roles, one
		// of a few, one of the admin only.
		asked := map[string][]string{
			"topics":        {pTopicsGet, pTopicsPublish, "pubsub.topics.getIamPolicy"},
			"subscriptions": {pSubscriptionsGet, pSubscriptionsConsume, "pubsub.subscriptions.getIamPolicy"},
			"snapshots":     {pSnapshotsGet, pSnapshotsSeek, "pubsub.snapshots.getIamPolicy"},
			"schemas":       {pSchemasGet, pSchemasCommit, "pubsub.schemas.getIamPolicy"},
		}[r.kind]
		t[methodName(policies, "GetIamPolicy")] = append(t[methodName(policies, "GetIamPolicy")], row{
			variant: variant, perms: []string{"pubsub." + r.kind + ".getIamPolicy"}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.iam.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: resource})
				return err
			},
			rest: func(string) restCall { return restCall{"GET", resource + ":getIamPolicy", ""} },
		})
		t[methodName(policies, "SetIamPolicy")] = append(t[methodName(policies, "SetIamPolicy")], row{
			variant: variant, perms: []string{"pubsub." + r.kind + ".setIamPolicy"}, ok: ok,
			grpc: func(ctx context.Context, c tableClients, _ string) error {
				_, err := c.iam.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: resource, Policy: &iampb.Policy{}})
				return err
			},
			rest: func(string) restCall { return restCall{"POST", resource + ":setIamPolicy", `{"policy":{}}`} },
		})
		t[methodName(policies, "TestIamPermissions")] = append(t[methodName(policies, "TestIamPermissions")], row{
			variant: variant, perms: nil, ok: ok,
			grpc: func(ctx context.Context, c tableClients, role string) error {
				resp, err := c.iam.TestIamPermissions(ctx, &iampb.TestIamPermissionsRequest{Resource: resource, Permissions: asked})
				if err != nil {
					return err
				}
				var want []string
				for _, p := range asked {
					if holds(role, []string{p}) {
						want = append(want, p)
					}
				}
				if !slices.Equal(resp.GetPermissions(), want) {
					return fmt.Errorf("TestIamPermissions answered %v, want %v", resp.GetPermissions(), want)
				}
				return nil
			},
			rest: func(string) restCall {
				return restCall{"POST", resource + ":testIamPermissions", js(map[string][]string{"permissions": asked})}
			},
		})
	}
	return t
}

// holds reports whether role holds every one of perms, by the role's
// contents in iam.Roles; "none" holds nothing.
func holds(role string, perms []string) bool {
	held := iam.Roles["roles/pubsub."+role]
	for _, p := range perms {
		if !slices.Contains(held, p) {
			return false
		}
	}
	return true
}

// serviceMethods are the methods of the services the sidecar serves, in
// their files' order.
func serviceMethods() []protoreflect.MethodDescriptor {
	var out []protoreflect.MethodDescriptor
	for _, f := range []protoreflect.FileDescriptor{
		pb.File_google_pubsub_v1_pubsub_proto, pb.File_google_pubsub_v1_schema_proto, iampb.File_google_iam_v1_iam_policy_proto,
	} {
		for i := range f.Services().Len() {
			s := f.Services().Get(i)
			for j := range s.Methods().Len() {
				out = append(out, s.Methods().Get(j))
			}
		}
	}
	return out
}

// tableFixtures creates, as the admin, the topic, its ordered
// subscription, a snapshot of that and an AVRO schema.
func tableFixtures(t *testing.T, sc *itest.Sidecar, a *itest.Access) fixtures {
	t.Helper()
	ctx := ctxT(t)
	conn := sc.ConnAs(a.Token("admin"))
	if _, err := pb.NewPublisherClient(conn).CreateTopic(ctx, &pb.Topic{Name: topicPath(tblTopic)}); err != nil {
		t.Fatalf("fixture topic: %v", err)
	}
	sub := pb.NewSubscriberClient(conn)
	created, err := sub.CreateSubscription(ctx, &pb.Subscription{Name: subPath(tblSub), Topic: topicPath(tblTopic), EnableMessageOrdering: true})
	if err != nil {
		t.Fatalf("fixture subscription: %v", err)
	}
	if _, err := sub.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: snapPath(tblSnap), Subscription: subPath(tblSub)}); err != nil {
		t.Fatalf("fixture snapshot: %v", err)
	}
	s, err := pb.NewSchemaServiceClient(conn).CreateSchema(ctx, &pb.CreateSchemaRequest{
		Parent: tblProject, SchemaId: tblSchema, Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: avroDefinition}})
	if err != nil {
		t.Fatalf("fixture schema: %v", err)
	}
	return fixtures{subLabels: created.GetLabels(), firstRevision: s.GetRevisionId()}
}

// callers are the roles of the table: itest.AccessRoles and a caller
// without credentials.
func callers() []string { return append(slices.Clone(itest.AccessRoles), anonymous) }

func tokenOf(a *itest.Access, role string) string {
	if role == anonymous {
		return ""
	}
	return a.Token(role)
}

func TestRoleMethodTable(t *testing.T) {
	for _, role := range itest.AccessRoles {
		if _, ok := iam.Roles["roles/pubsub."+role]; !ok && role != "none" {
			t.Fatalf("iam.Roles has no roles/pubsub.%s", role)
		}
	}
	a := itest.NewAccess(t)
	sc := itest.Start(t, sidecar.Config{}, itest.WithAccess(a))
	table := permissionTable(tableFixtures(t, sc, a))

	// Every method of the services has a row, and every row a method.
	methods := serviceMethods()
	known := map[protoreflect.FullName]bool{}
	for _, m := range methods {
		known[m.FullName()] = true
		if len(table[m.FullName()]) == 0 {
			t.Errorf("%s is not in the table", m.FullName())
		}
		for _, r := range table[m.FullName()] {
			if r.rest == nil && r.noREST == "" {
				t.Errorf("%s (%s) has no REST call and no reason for none", m.FullName(), r.variant)
			}
		}
	}
	for name := range table {
		if !known[name] {
			t.Errorf("the table has %s, which no service has", name)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	t.Run("grpc", func(t *testing.T) {
		clients := map[string]tableClients{}
		for _, role := range callers() {
			conn := sc.ConnAs(tokenOf(a, role))
			clients[role] = tableClients{pb.NewPublisherClient(conn), pb.NewSubscriberClient(conn), pb.NewSchemaServiceClient(conn), iampb.NewIAMPolicyClient(conn)}
		}
		forEachRow(t, methods, table, func(t *testing.T, r row, role string) {
			allowed := role != anonymous && holds(role, r.perms)
			timeout := 10 * time.Second
			if r.waits && allowed {
				timeout = 300 * time.Millisecond
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			checkGRPC(t, role, allowed, r.ok, r.grpc(ctx, clients[role], role))
		})
	})

	client := sc.HTTPClient()
	t.Run("rest", func(t *testing.T) {
		forEachRow(t, methods, table, func(t *testing.T, r row, role string) {
			if r.rest == nil {
				t.Skip(r.noREST)
			}
			c := r.rest(role)
			resp := doHTTP(t, client, c.method, sc.HTTPURL()+"/v1/"+c.path, tokenOf(a, role), "application/json", c.body)
			var ok []int
			for _, code := range r.ok {
				ok = append(ok, httpStatusOf[code])
			}
			checkHTTP(t, role, role != anonymous && holds(role, r.perms), ok, resp)
		})
	})

	// The HTTP API's routes that are not REST calls of a method.
	t.Run("http", func(t *testing.T) {
		cloudEvent := `{"specversion":"1.0","id":"1","source":"s","type":"t","data":"x"}`
		for _, route := range []struct {
			name, method, path, contentType, body string
			perms                                 []string
			open                                  bool
			ok                                    []int
		}{
			{name: "events", method: "POST", path: "/v1/" + topicPath(tblTopic) + "/events", contentType: "application/cloudevents+json", body: cloudEvent,
				perms: []string{pTopicsPublish}, ok: []int{http.StatusOK}},
			// The subscription does not track DIDComm threads: 404 for
			// whoever may ask.
			{name: "didcomm_thread", method: "GET", path: "/v1/" + subPath(tblSub) + "/didcomm/threads/thread-1",
				perms: []string{pSubscriptionsConsume}, ok: []int{http.StatusNotFound}},
			{name: "status_json", method: "GET", path: "/v1/status", perms: []string{pTopicsList, pSubscriptionsList}, ok: []int{http.StatusOK}},
			{name: "status_page", method: "GET", path: "/", perms: []string{pTopicsList, pSubscriptionsList}, ok: []int{http.StatusOK}},
			{name: "metrics", method: "GET", path: "/metrics", perms: []string{pTopicsList, pSubscriptionsList}, ok: []int{http.StatusOK}},
			{name: "healthz", method: "GET", path: "/healthz", open: true, ok: []int{http.StatusOK}},
			{name: "readyz", method: "GET", path: "/readyz", open: true, ok: []int{http.StatusOK}},
		} {
			t.Run(route.name, func(t *testing.T) {
				for _, role := range callers() {
					t.Run(role, func(t *testing.T) {
						resp := doHTTP(t, client, route.method, sc.HTTPURL()+route.path, tokenOf(a, role), route.contentType, route.body)
						if route.open {
							if resp.code != http.StatusOK {
								t.Errorf("%s %s: %d %s, want 200 (open to everyone)", route.method, route.path, resp.code, resp.body)
							}
							return
						}
						checkHTTP(t, role, role != anonymous && holds(role, route.perms), route.ok, resp)
					})
				}
			})
		}
	})
}

// forEachRow runs f for every row of every method, as every caller, in
// subtests named method[_variant]/role.
func forEachRow(t *testing.T, methods []protoreflect.MethodDescriptor, table map[protoreflect.FullName][]row, f func(t *testing.T, r row, role string)) {
	for _, m := range methods {
		for _, r := range table[m.FullName()] {
			name := string(m.Name())
			if r.variant != "" {
				name += "_" + r.variant
			}
			t.Run(name, func(t *testing.T) {
				for _, role := range callers() {
					t.Run(role, func(t *testing.T) { f(t, r, role) })
				}
			})
		}
	}
}

func checkGRPC(t *testing.T, role string, allowed bool, ok []codes.Code, err error) {
	t.Helper()
	st := status.Convert(err)
	switch {
	case role == anonymous:
		if st.Code() != codes.Unauthenticated {
			t.Errorf("without credentials: %s %q, want Unauthenticated", st.Code(), st.Message())
		}
	case !allowed:
		if st.Code() != codes.PermissionDenied || st.Message() != deniedText {
			t.Errorf("%s: %s %q, want PermissionDenied %q", role, st.Code(), st.Message(), deniedText)
		}
	case st.Code() == codes.PermissionDenied || st.Code() == codes.Unauthenticated:
		t.Errorf("%s: %s %q, want the call allowed", role, st.Code(), st.Message())
	case len(ok) > 0 && !slices.Contains(ok, st.Code()):
		t.Errorf("%s (allowed): %s %q, want one of %v", role, st.Code(), st.Message(), ok)
	}
}

// httpStatusOf is the HTTP status of the codes an allowed call may end
// with, as Google's REST API maps them.
var httpStatusOf = map[codes.Code]int{
	codes.OK:               http.StatusOK,
	codes.NotFound:         http.StatusNotFound,
	codes.InvalidArgument:  http.StatusBadRequest,
	codes.DeadlineExceeded: http.StatusGatewayTimeout,
	codes.Canceled:         499,
	codes.Unimplemented:    http.StatusNotImplemented,
}

type httpResponse struct {
	code   int
	header http.Header
	body   []byte
}

func doHTTP(t *testing.T, client *http.Client, method, url, token, contentType, body string) httpResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read the body: %v", method, url, err)
	}
	return httpResponse{resp.StatusCode, resp.Header, b}
}

// errorStatus is the status of Google's JSON error body.
func errorStatus(body []byte) (status, message string) {
	var e struct {
		Error struct {
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.NewDecoder(bytes.NewReader(body)).Decode(&e)
	return e.Error.Status, e.Error.Message
}

func checkHTTP(t *testing.T, role string, allowed bool, ok []int, resp httpResponse) {
	t.Helper()
	st, msg := errorStatus(resp.body)
	switch {
	case role == anonymous:
		if resp.code != http.StatusUnauthorized || st != "UNAUTHENTICATED" || resp.header.Get("WWW-Authenticate") == "" {
			t.Errorf("without credentials: %d (WWW-Authenticate %q) %s, want 401 UNAUTHENTICATED with WWW-Authenticate",
				resp.code, resp.header.Get("WWW-Authenticate"), resp.body)
		}
	case !allowed:
		if resp.code != http.StatusForbidden || st != "PERMISSION_DENIED" || msg != deniedText {
			t.Errorf("%s: %d %s, want 403 PERMISSION_DENIED %q", role, resp.code, resp.body, deniedText)
		}
	case resp.code == http.StatusUnauthorized || resp.code == http.StatusForbidden:
		t.Errorf("%s: %d %s, want the call allowed", role, resp.code, resp.body)
	case len(ok) > 0 && !slices.Contains(ok, resp.code):
		t.Errorf("%s (allowed): %d %s, want one of %v", role, resp.code, resp.body, ok)
	}
}

package iam

import (
	"context"
	"strings"

	"cloud.google.com/go/iam/apiv1/iampb"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// need is one permission a call needs on one resource: a project
// ("projects/P") or a resource in it ("projects/P/topics/T").
type need struct {
	perm     string
	resource string
}

// rule returns what a call needs, from its request. ctx and g are for the
// rules that look something up (DetachSubscription: the subscription's
// topic).
type rule func(ctx context.Context, g *Guard, req proto.Message) []need

// on is the rule of a call that needs perm on the resource its request
// names in field.
func on[Req proto.Message](perm string, field func(Req) string) rule {
	return func(_ context.Context, _ *Guard, req proto.Message) []need {
		return []need{{perm, field(req.(Req))}}
	}
}

// inProject is the rule of a call that needs perm on the project of the
// name its request holds (a resource to create, or a project itself).
func inProject[Req proto.Message](perm string, field func(Req) string) rule {
	return func(_ context.Context, _ *Guard, req proto.Message) []need {
		return []need{{perm, ProjectOf(field(req.(Req)))}}
	}
}

// rules are the permissions of every method the sidecar serves, by request
// type, as Google's access control table gives them
// (cloud.google.com/pubsub/docs/access-control). A method missing here is
// refused to everyone but a caller with every Pub/Sub permission.
var rules = map[protoreflect.FullName]rule{
	// Publisher
	name[*pb.Topic](): func(_ context.Context, _ *Guard, req proto.Message) []need {
		t := req.(*pb.Topic)
		n := []need{{TopicsCreate, ProjectOf(t.GetName())}}
		if s := t.GetSchemaSettings().GetSchema(); s != "" {
			n = append(n, need{SchemasAttach, s})
		}
		return n
	},
	name[*pb.UpdateTopicRequest](): func(_ context.Context, _ *Guard, req proto.Message) []need {
		r := req.(*pb.UpdateTopicRequest)
		n := []need{{TopicsUpdate, r.GetTopic().GetName()}}
		if s := r.GetTopic().GetSchemaSettings().GetSchema(); s != "" {
			n = append(n, need{SchemasAttach, s})
		}
		return n
	},
	name[*pb.PublishRequest]():                on(TopicsPublish, (*pb.PublishRequest).GetTopic),
	name[*pb.GetTopicRequest]():               on(TopicsGet, (*pb.GetTopicRequest).GetTopic),
	name[*pb.ListTopicsRequest]():             on(TopicsList, (*pb.ListTopicsRequest).GetProject),
	name[*pb.ListTopicSubscriptionsRequest](): on(TopicsGet, (*pb.ListTopicSubscriptionsRequest).GetTopic),
	name[*pb.ListTopicSnapshotsRequest]():     on(TopicsGet, (*pb.ListTopicSnapshotsRequest).GetTopic),
	name[*pb.DeleteTopicRequest]():            on(TopicsDelete, (*pb.DeleteTopicRequest).GetTopic),
	name[*pb.DetachSubscriptionRequest](): func(ctx context.Context, g *Guard, req proto.Message) []need {
		// On the topic the subscription is attached to; when it cannot be
		// found, on its project, so that the answer (NOT_FOUND) goes only
		// to callers who could detach it.
		sub := req.(*pb.DetachSubscriptionRequest).GetSubscription()
		if g.topicOf != nil {
			if t, err := g.topicOf(ctx, sub); err == nil && t != "" {
				return []need{{TopicsDetachSubscription, t}}
			}
		}
		return []need{{TopicsDetachSubscription, ProjectOf(sub)}}
	},

	// Subscriber
	name[*pb.Subscription](): func(_ context.Context, _ *Guard, req proto.Message) []need {
		s := req.(*pb.Subscription)
		return []need{{SubscriptionsCreate, ProjectOf(s.GetName())}, {TopicsAttachSubscription, s.GetTopic()}}
	},
	name[*pb.GetSubscriptionRequest]():    on(SubscriptionsGet, (*pb.GetSubscriptionRequest).GetSubscription),
	name[*pb.UpdateSubscriptionRequest](): on(SubscriptionsUpdate, func(r *pb.UpdateSubscriptionRequest) string { return r.GetSubscription().GetName() }),
	name[*pb.ListSubscriptionsRequest]():  on(SubscriptionsList, (*pb.ListSubscriptionsRequest).GetProject),
	name[*pb.DeleteSubscriptionRequest](): on(SubscriptionsDelete, (*pb.DeleteSubscriptionRequest).GetSubscription),
	name[*pb.ModifyAckDeadlineRequest]():  on(SubscriptionsConsume, (*pb.ModifyAckDeadlineRequest).GetSubscription),
	name[*pb.AcknowledgeRequest]():        on(SubscriptionsConsume, (*pb.AcknowledgeRequest).GetSubscription),
	name[*pb.PullRequest]():               on(SubscriptionsConsume, (*pb.PullRequest).GetSubscription),
	name[*pb.StreamingPullRequest]():      on(SubscriptionsConsume, (*pb.StreamingPullRequest).GetSubscription),
	name[*pb.ModifyPushConfigRequest]():   on(SubscriptionsUpdate, (*pb.ModifyPushConfigRequest).GetSubscription),
	name[*pb.GetSnapshotRequest]():        on(SnapshotsGet, (*pb.GetSnapshotRequest).GetSnapshot),
	name[*pb.ListSnapshotsRequest]():      on(SnapshotsList, (*pb.ListSnapshotsRequest).GetProject),
	name[*pb.CreateSnapshotRequest](): func(_ context.Context, _ *Guard, req proto.Message) []need {
		r := req.(*pb.CreateSnapshotRequest)
		project := ProjectOf(r.GetName())
		if r.GetName() == "" { // the snapshot is named in the subscription's project
			project = ProjectOf(r.GetSubscription())
		}
		return []need{{SnapshotsCreate, project}, {SubscriptionsConsume, r.GetSubscription()}}
	},
	name[*pb.UpdateSnapshotRequest](): on(SnapshotsUpdate, func(r *pb.UpdateSnapshotRequest) string { return r.GetSnapshot().GetName() }),
	name[*pb.DeleteSnapshotRequest](): on(SnapshotsDelete, (*pb.DeleteSnapshotRequest).GetSnapshot),
	name[*pb.SeekRequest](): func(_ context.Context, _ *Guard, req proto.Message) []need {
		r := req.(*pb.SeekRequest)
		n := []need{{SubscriptionsConsume, r.GetSubscription()}}
		if s := r.GetSnapshot(); s != "" {
			n = append(n, need{SnapshotsSeek, s})
		}
		return n
	},

	// SchemaService
	name[*pb.CreateSchemaRequest]():         inProject(SchemasCreate, (*pb.CreateSchemaRequest).GetParent),
	name[*pb.GetSchemaRequest]():            on(SchemasGet, (*pb.GetSchemaRequest).GetName),
	name[*pb.ListSchemasRequest]():          on(SchemasList, (*pb.ListSchemasRequest).GetParent),
	name[*pb.ListSchemaRevisionsRequest]():  on(SchemasListRevisions, (*pb.ListSchemaRevisionsRequest).GetName),
	name[*pb.CommitSchemaRequest]():         on(SchemasCommit, (*pb.CommitSchemaRequest).GetName),
	name[*pb.RollbackSchemaRequest]():       on(SchemasRollback, (*pb.RollbackSchemaRequest).GetName),
	name[*pb.DeleteSchemaRevisionRequest](): on(SchemasDelete, (*pb.DeleteSchemaRevisionRequest).GetName),
	name[*pb.DeleteSchemaRequest]():         on(SchemasDelete, (*pb.DeleteSchemaRequest).GetName),
	name[*pb.ValidateSchemaRequest]():       inProject(SchemasValidate, (*pb.ValidateSchemaRequest).GetParent),
	name[*pb.ValidateMessageRequest]():      inProject(SchemasValidate, (*pb.ValidateMessageRequest).GetParent),

	// IAMPolicy: the permission follows the resource's kind.
	name[*iampb.GetIamPolicyRequest](): func(_ context.Context, _ *Guard, req proto.Message) []need {
		r := req.(*iampb.GetIamPolicyRequest).GetResource()
		return []need{{iamPermission(r, "getIamPolicy"), r}}
	},
	name[*iampb.SetIamPolicyRequest](): func(_ context.Context, _ *Guard, req proto.Message) []need {
		r := req.(*iampb.SetIamPolicyRequest).GetResource()
		return []need{{iamPermission(r, "setIamPolicy"), r}}
	},
	// TestIamPermissions needs none: it answers with what the caller has.
	name[*iampb.TestIamPermissionsRequest](): func(context.Context, *Guard, proto.Message) []need { return nil },
}

func name[M proto.Message]() protoreflect.FullName {
	var m M
	return m.ProtoReflect().Descriptor().FullName()
}

// ProjectOf is "projects/P" of a name "projects/P/…", or name itself when
// it is one. A malformed name is returned as it is: no policy names it, so
// only a grant for every project allows the call, whose own check then
// refuses the name.
func ProjectOf(name string) string {
	rest, ok := strings.CutPrefix(name, "projects/")
	if !ok {
		return name
	}
	id, _, _ := strings.Cut(rest, "/")
	return "projects/" + id
}

// KindOf is a resource's collection: "topics", "subscriptions",
// "snapshots" or "schemas"; "" for a project or a malformed name.
func KindOf(resource string) string {
	parts := strings.Split(resource, "/")
	if len(parts) != 4 || parts[0] != "projects" {
		return ""
	}
	return parts[2]
}

// iamPermission is the permission of an IAMPolicy verb on resource:
// pubsub.topics.getIamPolicy and so on. An unknown kind gets a permission
// no role holds.
func iamPermission(resource, verb string) string {
	switch k := KindOf(resource); k {
	case "topics", "subscriptions", "snapshots", "schemas":
		return "pubsub." + k + "." + verb
	}
	return "pubsub.unknown." + verb
}

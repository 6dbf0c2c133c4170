package httpapi

import (
	"context"
	"net/http"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/jetorder/jetorder/internal/iam"
	"github.com/jetorder/jetorder/internal/status"
)

// Access control of the routes that are not REST calls of a Pub/Sub
// method (those are authorized in serveREST). ServeHTTP has authenticated
// the caller; each check answers a refusal itself and returns false.

// mayPublish: publishing, through :publish or /events, needs
// pubsub.topics.publish on the topic, as Publish does.
func (a *api) mayPublish(w http.ResponseWriter, r *http.Request, project, topic string) bool {
	return a.authorized(w, r, a.guard.Authorize(r.Context(), "Publish", &pb.PublishRequest{Topic: resourceName(project, "topics", topic)}))
}

// mayReadThread: a DIDComm thread's received_orders say what a
// subscription's consumers got, so reading them needs what consuming
// does, pubsub.subscriptions.consume.
func (a *api) mayReadThread(w http.ResponseWriter, r *http.Request, subscription string) bool {
	if a.guard.Allows(r.Context(), iam.SubscriptionsConsume, subscription) {
		return true
	}
	return a.authorized(w, r, a.guard.Refusal(r.Context(), "GET didcomm thread", iam.SubscriptionsConsume))
}

// mayReadStatus: the status page lists topics and subscriptions, so it
// needs what roles/pubsub.viewer grants for that, in some project; it
// then shows only the projects where the caller has it (visibleStatus).
func (a *api) mayReadStatus(w http.ResponseWriter, r *http.Request) bool {
	ctx := r.Context()
	if a.guard.AllowsSomewhere(ctx, iam.TopicsList) && a.guard.AllowsSomewhere(ctx, iam.SubscriptionsList) {
		return true
	}
	return a.authorized(w, r, a.guard.Refusal(ctx, "GET "+r.URL.Path, iam.TopicsList))
}

// mayReadMetrics: /metrics covers every project, so unless it is open it
// needs the status page's permissions in every project.
func (a *api) mayReadMetrics(w http.ResponseWriter, r *http.Request) bool {
	ctx := r.Context()
	if a.guard.AllowsEverywhere(ctx, iam.TopicsList) && a.guard.AllowsEverywhere(ctx, iam.SubscriptionsList) {
		return true
	}
	return a.authorized(w, r, a.guard.Refusal(ctx, "GET /metrics", iam.TopicsList))
}

func (a *api) authorized(w http.ResponseWriter, r *http.Request, err error) bool {
	if err != nil {
		a.restFail(w, r, err)
		return false
	}
	return true
}

// visibleStatus is st with only the topics, subscriptions and clients the
// caller may list.
func (a *api) visibleStatus(ctx context.Context, st *status.Status) *status.Status {
	if a.guard == nil || st == nil {
		return st
	}
	out := *st
	out.Topics = make([]status.Topic, 0, len(st.Topics))
	for _, t := range st.Topics {
		if a.guard.Allows(ctx, iam.TopicsList, iam.ProjectOf(t.Name)) {
			out.Topics = append(out.Topics, t)
		}
	}
	out.Subscriptions = make([]status.Subscription, 0, len(st.Subscriptions))
	for _, s := range st.Subscriptions {
		if a.guard.Allows(ctx, iam.SubscriptionsList, iam.ProjectOf(s.Name)) {
			out.Subscriptions = append(out.Subscriptions, s)
		}
	}
	out.Clients = make([]status.Client, 0, len(st.Clients))
	for _, c := range st.Clients {
		if a.guard.Allows(ctx, iam.SubscriptionsList, iam.ProjectOf(c.Subscription)) {
			out.Clients = append(out.Clients, c)
		}
	}
	return &out
}

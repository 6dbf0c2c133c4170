package httpapi

import (
	"context"
	"errors"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/didcomm"
	"github.com/jetorder/jetorder/internal/broker"
	"github.com/jetorder/jetorder/keyrouter"
)

// threadTimeout bounds a thread lookup: the subscription's record and
// topic, its state bucket, and the thread's saved state.
const threadTimeout = 10 * time.Second

// threadResponse is a DIDComm thread as a subscription's tracker saved it.
type threadResponse struct {
	Thread string `json:"thread"`
	// ReceivedOrders is in the DIDComm received_orders format: never null,
	// and every entry's gaps an array.
	ReceivedOrders []didcomm.ReceivedOrder `json:"received_orders"`
}

// didcommThread serves subscriptions/{subscription}/didcomm/threads/{thread}
// (and threads/ with no thread, to refuse it with 400 rather than 404).
//
// The thread id is one path segment. ServeMux splits the escaped path
// (URL.EscapedPath) at its '/' and unescapes each segment on its own, so
// PathValue gives the id whole, with any %2F in it a '/'. A path that is not
// valid percent-encoding never reaches a handler: net/http refuses the
// request line with a plain-text 400.
func (a *api) didcommThread(w http.ResponseWriter, r *http.Request, project string) {
	if !a.allow(w, r, http.MethodGet, http.MethodHead) {
		return
	}
	id, thread := r.PathValue("subscription"), r.PathValue("thread")
	if err := validateThread(project, id, thread); err != nil {
		a.fail(w, r, err)
		return
	}
	if !a.mayReadThread(w, r, resourceName(project, "subscriptions", id)) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), threadTimeout)
	defer cancel()
	ros, err := a.receivedOrders(ctx, project, id, thread)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.writeJSON(w, http.StatusOK, threadResponse{Thread: thread, ReceivedOrders: ros})
}

// receivedOrders reads the thread's received_orders from the store of the
// subscription's tracker, as the last tracker to save it left it: an
// unknown thread has none. It opens a tracker per call: that reads the
// subscription's record and looks its state bucket up
// (Subscription.LayerState), which a cached tracker would need as well, to
// notice a subscription deleted and created again under the same id.
func (a *api) receivedOrders(ctx context.Context, project, id, thread string) ([]didcomm.ReceivedOrder, error) {
	c, err := a.b.Client(project)
	if err != nil {
		return nil, err
	}
	sub := c.Subscription(id)
	cfg, err := sub.Config(ctx)
	if err != nil {
		return nil, subscriptionError(err)
	}
	if !broker.DIDCommTracked(cfg.Labels) {
		return nil, errorf(http.StatusNotFound, "%s does not track DIDComm threads: give it the label %s: %s to turn tracking on",
			sub, broker.LabelDIDComm, broker.DIDCommTrack)
	}
	// Opening the tracker creates the state bucket if no tracker did yet,
	// as didcomm.Receive would.
	tr, err := didcomm.OpenSubscriptionTracker(ctx, sub)
	if err != nil {
		return nil, subscriptionError(err) // deleted since Config
	}
	return tr.ReceivedOrders(ctx, thread) // every entry's gaps an array, as the format wants
}

// validateThread checks the names of a thread request. A thread id is
// whatever a DIDComm thid can be: any non-empty string, which JSON makes
// UTF-8.
func validateThread(project, subscription, thread string) error {
	if err := keyrouter.ValidateProjectID(project); err != nil {
		return badRequest(err)
	}
	if err := keyrouter.ValidateSubscriptionID(subscription); err != nil {
		return badRequest(err)
	}
	switch {
	case thread == "":
		return errorf(http.StatusBadRequest, "thread id is empty: put it, percent-encoded, after threads/")
	case !utf8.ValidString(thread):
		return errorf(http.StatusBadRequest, "thread id %q is not UTF-8 once percent-decoded: a DIDComm thid is a JSON string", thread)
	}
	return nil
}

// subscriptionError gives a missing subscription its 404; statusOf decides
// the rest.
func subscriptionError(err error) error {
	if errors.Is(err, adapter.ErrSubscriptionNotFound) {
		return errorf(http.StatusNotFound, "%w", err)
	}
	return err
}

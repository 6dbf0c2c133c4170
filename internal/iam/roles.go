package iam

import (
	"maps"
	"slices"
	"strings"
)

// Pub/Sub's permissions, as Google names them.
const (
	TopicsAttachSubscription = "pubsub.topics.attachSubscription"
	TopicsCreate             = "pubsub.topics.create"
	TopicsDelete             = "pubsub.topics.delete"
	TopicsDetachSubscription = "pubsub.topics.detachSubscription"
	TopicsGet                = "pubsub.topics.get"
	TopicsGetIamPolicy       = "pubsub.topics.getIamPolicy"
	TopicsList               = "pubsub.topics.list"
	TopicsPublish            = "pubsub.topics.publish"
	TopicsSetIamPolicy       = "pubsub.topics.setIamPolicy"
	TopicsUpdate             = "pubsub.topics.update"
	TopicsUpdateTag          = "pubsub.topics.updateTag"

	SubscriptionsConsume      = "pubsub.subscriptions.consume"
	SubscriptionsCreate       = "pubsub.subscriptions.create"
	SubscriptionsDelete       = "pubsub.subscriptions.delete"
	SubscriptionsGet          = "pubsub.subscriptions.get"
	SubscriptionsGetIamPolicy = "pubsub.subscriptions.getIamPolicy"
	SubscriptionsList         = "pubsub.subscriptions.list"
	SubscriptionsSetIamPolicy = "pubsub.subscriptions.setIamPolicy"
	SubscriptionsUpdate       = "pubsub.subscriptions.update"

	SnapshotsCreate       = "pubsub.snapshots.create"
	SnapshotsDelete       = "pubsub.snapshots.delete"
	SnapshotsGet          = "pubsub.snapshots.get"
	SnapshotsGetIamPolicy = "pubsub.snapshots.getIamPolicy"
	SnapshotsList         = "pubsub.snapshots.list"
	SnapshotsSeek         = "pubsub.snapshots.seek"
	SnapshotsSetIamPolicy = "pubsub.snapshots.setIamPolicy"
	SnapshotsUpdate       = "pubsub.snapshots.update"

	SchemasAttach        = "pubsub.schemas.attach"
	SchemasCommit        = "pubsub.schemas.commit"
	SchemasCreate        = "pubsub.schemas.create"
	SchemasDelete        = "pubsub.schemas.delete"
	SchemasGet           = "pubsub.schemas.get"
	SchemasGetIamPolicy  = "pubsub.schemas.getIamPolicy"
	SchemasList          = "pubsub.schemas.list"
	SchemasListRevisions = "pubsub.schemas.listRevisions"
	SchemasRollback      = "pubsub.schemas.rollback"
	SchemasSetIamPolicy  = "pubsub.schemas.setIamPolicy"
	SchemasValidate      = "pubsub.schemas.validate"
)

// viewerPermissions are roles/pubsub.viewer's: read configuration, no
// messages, no policies.
var viewerPermissions = []string{
	SchemasGet, SchemasList, SchemasListRevisions, SchemasValidate,
	SnapshotsGet, SnapshotsList,
	SubscriptionsGet, SubscriptionsList,
	TopicsGet, TopicsList,
}

// editorPermissions are roles/pubsub.editor's: everything but reading and
// setting IAM policies.
var editorPermissions = []string{
	SchemasAttach, SchemasCommit, SchemasCreate, SchemasDelete, SchemasGet, SchemasList,
	SchemasListRevisions, SchemasRollback, SchemasValidate,
	SnapshotsCreate, SnapshotsDelete, SnapshotsGet, SnapshotsList, SnapshotsSeek, SnapshotsUpdate,
	SubscriptionsConsume, SubscriptionsCreate, SubscriptionsDelete, SubscriptionsGet,
	SubscriptionsList, SubscriptionsUpdate,
	TopicsAttachSubscription, TopicsCreate, TopicsDelete, TopicsDetachSubscription, TopicsGet,
	TopicsList, TopicsPublish, TopicsUpdate, TopicsUpdateTag,
}

// adminPermissions are roles/pubsub.admin's: every Pub/Sub permission.
var adminPermissions = append(slices.Clone(editorPermissions),
	SchemasGetIamPolicy, SchemasSetIamPolicy,
	SnapshotsGetIamPolicy, SnapshotsSetIamPolicy,
	SubscriptionsGetIamPolicy, SubscriptionsSetIamPolicy,
	TopicsGetIamPolicy, TopicsSetIamPolicy,
)

// Roles are the roles a policy may grant, with the Pub/Sub permissions
// each holds in Google's docs (cloud.google.com/iam/docs/roles-permissions/pubsub):
// Pub/Sub's predefined roles, and the basic roles, whose Pub/Sub
// permissions are those of admin (owner), editor and viewer.
var Roles = map[string][]string{
	"roles/pubsub.admin":      adminPermissions,
	"roles/pubsub.editor":     editorPermissions,
	"roles/pubsub.publisher":  {TopicsPublish},
	"roles/pubsub.subscriber": {SnapshotsSeek, SubscriptionsConsume, TopicsAttachSubscription},
	"roles/pubsub.viewer":     viewerPermissions,
	"roles/owner":             adminPermissions,
	"roles/editor":            editorPermissions,
	"roles/viewer":            viewerPermissions,
}

// Permissions lists every Pub/Sub permission, sorted.
func Permissions() []string { return slices.Sorted(slices.Values(adminPermissions)) }

// knownPermission reports whether p is a Pub/Sub permission.
func knownPermission(p string) bool { return slices.Contains(adminPermissions, p) }

// roleNames lists the roles a policy may grant, for errors.
func roleNames() string { return strings.Join(slices.Sorted(maps.Keys(Roles)), ", ") }

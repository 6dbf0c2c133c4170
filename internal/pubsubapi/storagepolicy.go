package pubsubapi

import (
	"regexp"
	"slices"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// A topic's message_storage_policy: the regions where the service may
// store its messages. The sidecar keeps and returns it, and stores
// messages where its NATS servers are, whatever it says: placing streams
// by it is the operator's choice of servers (docs/SIDECAR.md).

// storagePolicy is a topic's message_storage_policy as its service
// settings keep it (member topicStoragePolicyMember).
type storagePolicy struct {
	Regions          []string `json:"allowedPersistenceRegions"`
	EnforceInTransit bool     `json:"enforceInTransit,omitempty"`
}

// regionPattern is the form of Google Cloud region names: us-east1,
// europe-west4, northamerica-northeast1.
var regionPattern = regexp.MustCompile(`^[a-z]+(-[a-z]+)+[0-9]+$`)

// checkStoragePolicy checks topic name's policy p; nil for none. A policy
// without regions is refused, as the service refuses it ("removing all
// regions" fails in Google's v1 client tests): no policy is how to have
// none.
func checkStoragePolicy(name string, p *pb.MessageStoragePolicy) (*storagePolicy, error) {
	if p == nil {
		return nil, nil
	}
	if len(p.GetAllowedPersistenceRegions()) == 0 {
		return nil, invalid("topic %s: message_storage_policy names no region in allowed_persistence_regions", name)
	}
	for _, r := range p.GetAllowedPersistenceRegions() {
		if !regionPattern.MatchString(r) {
			return nil, invalid("topic %s: message_storage_policy: %q is not a region name (such as us-east1)", name, r)
		}
	}
	return &storagePolicy{Regions: slices.Clone(p.GetAllowedPersistenceRegions()), EnforceInTransit: p.GetEnforceInTransit()}, nil
}

// withStoragePolicy returns the service settings settings with their
// storage policy replaced by sp (nil: removed), other members kept.
func withStoragePolicy(settings string, sp *storagePolicy) (string, error) {
	return withTopicMember(settings, topicStoragePolicyMember, sp, sp == nil)
}

// storagePolicyProto reads topic name's policy from its service settings;
// nil means none.
func storagePolicyProto(name, settings string) (*pb.MessageStoragePolicy, error) {
	var sp storagePolicy
	if ok, err := topicMember(name, settings, topicStoragePolicyMember, &sp); !ok || err != nil {
		return nil, err
	}
	return &pb.MessageStoragePolicy{AllowedPersistenceRegions: sp.Regions, EnforceInTransit: sp.EnforceInTransit}, nil
}

package broker

// DIDComm sequencing in the sidecar (docs/SIDECAR.md): a subscription label
// switches tracking on, and a message attribute asks for stamping.
const (
	// LabelDIDComm with the value DIDCommTrack on a subscription has the
	// sidecar track the DIDComm sequencing of every message it delivers,
	// with the subscription's shared tracker.
	LabelDIDComm = "jetorder-didcomm"
	DIDCommTrack = "track"
	// AttrDIDComm with the value DIDCommStamp on a published message has
	// the sidecar give it the next sender_order of its thread and sender
	// before it is stored; the attribute itself is not stored.
	AttrDIDComm  = "jetorder-didcomm"
	DIDCommStamp = "stamp"
)

// DIDCommTracked reports whether a subscription's labels switch DIDComm
// tracking on.
func DIDCommTracked(labels map[string]string) bool { return labels[LabelDIDComm] == DIDCommTrack }

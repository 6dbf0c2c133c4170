// Package link holds what package adapter lends this repository's own
// packages and not its users, untyped, so that adapter can import it
// without an import cycle. Package adapter fills every variable at init;
// use them through package adapterx, which types them.
package link

// Each is the function of the same name in package adapterx.
var (
	Refuse     any
	Validate   any
	State      any
	Superseded any
	HandOver   any
	Revoked    any
	FromStored any
)

"""The gang controller: a borrower gang whose member is disrupted goes whole (docs/gangs.md)."""

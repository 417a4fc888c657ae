"""The rendezvous picks rank 0's port on the trainer's host, also when that host is another machine
(a container of the compose stack: its address cannot be bound here, so no port of it can be tested)."""

from __future__ import annotations

import socket

from services.synchronizer.members import Member, Role
from services.synchronizer.rendezvous import EPHEMERAL_PORTS, Rendezvous, master_port

OTHER_HOST = "192.0.2.7"  # TEST-NET-1 (RFC 5737): never an address of this machine


def _members(trainer_address: str, port: int = 0) -> list[Member]:
    return [
        Member("trainer", Role.TRAINER, address=trainer_address, weight_sync_port=port, seq=1),
        Member("explorer-a", Role.EXPLORER, address="explorer-a:50052", seq=2),
    ]


def test_a_port_of_this_host_is_free_here():
    port = master_port("127.0.0.1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free a moment ago, so (almost surely) bindable now


def test_another_hosts_address_gets_an_ephemeral_port_instead_of_an_error():
    ports = {master_port(OTHER_HOST) for _ in range(20)}
    assert all(EPHEMERAL_PORTS[0] <= p <= EPHEMERAL_PORTS[1] for p in ports)
    assert len(ports) > 1  # random: a port taken there is not chosen again and again
    assert EPHEMERAL_PORTS[0] <= master_port("no-such-host.invalid") <= EPHEMERAL_PORTS[1]


def test_rebuild_for_a_trainer_on_another_host():
    rdv = Rendezvous()
    rdv.set_specs(())
    gen = rdv.rebuild(_members(f"{OTHER_HOST}:50053"))
    info = rdv.assignment("explorer-a").info
    assert (info.master_address, info.generation, info.world_size) == (OTHER_HOST, gen, 2)
    assert rdv.assignment("trainer").ranks == (0,)


def test_a_registered_port_is_kept_across_generations():
    rdv = Rendezvous()
    members = _members(f"{OTHER_HOST}:50053", port=41234)
    rdv.rebuild(members)
    first = rdv.assignment("trainer").info
    rdv.rebuild(members)
    second = rdv.assignment("trainer").info
    assert first.master_port == second.master_port == 41234 and second.generation == first.generation + 1

"""Every backend fills its role: it has each method the Protocol declares, with the same parameters."""

import inspect

import pytest
from conftest import make_settings

from kb.core import roles
from kb.engine.embedding import HashingEmbedder, SentenceTransformerEmbedder
from kb.engine.knowledge import KnowledgeBase
from kb.engine.search import Retriever, VotingRetriever
from kb.engine.store import ChromaStore
from kb.engine.suggest import SuggestionEngine
from kb.llm.suggester import LLMSuggester
from kb.tickets.api import GitHubTicketApi, JiraTicketApi, TicketSystem
from kb.tickets.outbox import OutboxTicketSystem

FILLED_BY = [
    (roles.Embedder, SentenceTransformerEmbedder), (roles.Embedder, HashingEmbedder),
    (roles.Store, ChromaStore),
    (roles.Retriever, Retriever), (roles.Retriever, VotingRetriever),
    (roles.Suggester, SuggestionEngine), (roles.Suggester, LLMSuggester),
    (TicketSystem, GitHubTicketApi), (TicketSystem, JiraTicketApi), (TicketSystem, OutboxTicketSystem),
]


def _methods(protocol) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(protocol).items()
            if callable(member) and not name.startswith("_")}


@pytest.mark.parametrize("protocol, backend", FILLED_BY, ids=lambda x: x.__name__)
def test_the_backend_has_every_method_of_its_role_with_its_parameters(protocol, backend):
    wanted = _methods(protocol)
    assert wanted, f"{protocol.__name__} declares no methods"
    for name, signature in wanted.items():
        assert hasattr(backend, name), f"{backend.__name__} lacks {name}"
        have = inspect.signature(getattr(backend, name)).parameters
        for parameter in signature.parameters.values():
            assert parameter.name in have, f"{backend.__name__}.{name} lacks parameter {parameter.name!r}"
            if parameter.default is not inspect.Parameter.empty:
                assert have[parameter.name].default is not inspect.Parameter.empty, \
                    f"{backend.__name__}.{name}: {parameter.name!r} must be optional as in {protocol.__name__}"


def test_a_built_engine_and_store_are_instances_of_their_roles(tmp_path):
    kb = KnowledgeBase(make_settings(tmp_path / "kb", embedder="hashing"))
    kb.add_incidents(kb.bundled_incidents()[:10])
    engine = SuggestionEngine(kb)
    assert isinstance(engine, roles.Suggester) and isinstance(engine.retriever, roles.Retriever)
    assert isinstance(kb.store, roles.Store) and isinstance(kb.embedder, roles.Embedder)

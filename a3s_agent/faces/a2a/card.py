"""The agent card: who we are, where JSON-RPC is served, the bearer token the HTTP face wants, and
a skill per agent and skill the server offers.

Behind a token, the open card at the well-known path names only the general skill: which agents
and skills the workspace has is for clients with the token, in the extended card
(GetExtendedAgentCard)."""

from __future__ import annotations

from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentProvider,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, TransportProtocol

from ...app import Application

RPC_PATH = "/a2a"
BEARER = "bearer"
GENERAL = AgentSkill(
    id="coding",
    name="Coding in the workspace",
    description="Reads, changes and runs the code of the workspace to do the task it is given.",
    tags=["coding"],
)


async def agent_card(app: Application, base_url: str, *, extended: bool = False) -> AgentCard:
    """The open card (`extended`: the one for clients with the token, or without one)."""
    info = app.lifecycle.info
    with_token = bool(app.lifecycle.settings.auth_token)
    listed = extended or not with_token
    agents = (await app.subagents.agents()).agents if listed else []
    skills = await app.skills.listing(None) if listed else []
    card = AgentCard(
        name=info.name,
        description=info.description,
        version=info.version,
        documentation_url=info.homepage,
        provider=AgentProvider(organization=info.author, url=info.homepage),
        supported_interfaces=[
            AgentInterface(
                url=base_url + RPC_PATH,
                protocol_binding=TransportProtocol.JSONRPC.value,
                protocol_version=PROTOCOL_VERSION_CURRENT,
            )
        ],
        capabilities=AgentCapabilities(
            streaming=True, push_notifications=app.push.offered, extended_agent_card=with_token
        ),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain", "text/x-diff"],
        skills=[
            GENERAL,
            *(
                AgentSkill(id=f"agent:{a.name}", name=a.name, description=a.description, tags=["agent"])
                for a in agents
            ),
            *(
                AgentSkill(
                    id=f"skill:{s.skill.name}",
                    name=s.skill.name,
                    description=s.skill.description,
                    tags=["skill"],
                )
                for s in skills
            ),
        ],
    )
    if with_token:
        card.security_schemes[BEARER].CopyFrom(
            SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="Bearer"))
        )
        card.security_requirements.append(SecurityRequirement(schemes={BEARER: StringList()}))
    return card
